"""Wall-clock figures of `scripts/bench_data.py` beside its per-core one, measured in the same run:
tokens/s with 2 workers against 1 (goal >= 1.7x on two cores), and, when `megatron_lm=` names
Megatron-LM's `tools/preprocess_data.py` (it ships in the Megatron-LM repository, not in the
wheel: put the one file anywhere), the same corpus, tokenizer and worker count through that tool,
its output compared byte for byte and its speed set against ours (goal >= 1.0x).

The workers' scaling times `prepare()` in this process (imports done, workers forked), by wall
clock. For the comparison both tools run as their own processes, timed by wall clock; each is
run once on a one-document corpus first, and that fixed cost (interpreter, imports, start-up)
is taken off, so the ratio compares the work on the corpus. Worker processes inherit every core
the machine has (the per-core part of the benchmark pins itself to one). A corpus too small to
give each of the SHARDS (or `workers`) shards a document is cut into fewer (`shards_for`).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from plugins.protocol.errors import UserError
from trainer.tools.benchmarks.child_runs import child_failure

REPO = Path(__file__).resolve().parents[3]
SHARDS = 4  # shards of the scaling runs (at least the workers, so each worker has work)


def shards_for(corpus: Path, most: int) -> int:
    """The most shards, up to `most`, that cut the JSONL corpus so that a document starts in
    each shard's byte range (prepare_data cuts a file into equal byte ranges, `shards.cut`, and
    a range reads the lines that start in it; a range where none starts is refused as an empty
    shard): a small corpus of a few large documents takes fewer. 1 always does."""
    from bisect import bisect_left

    from data_prep.shards import cut

    data = corpus.read_bytes()
    size = len(data)
    starts = [0] + [m.end() for m in re.finditer(b"\n", data) if m.end() < size]

    def starts_in(low: int, high: int) -> bool:
        index = bisect_left(starts, low)
        return index < len(starts) and starts[index] < high

    for count in range(most, 1, -1):
        if all(starts_in(*cut(size, count, j)) for j in range(count)):
            return count
    return 1


def _timed(command: list[str], cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS",)}
    env["PYTHONPATH"] = str(REPO)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        script = Path(command[1])
        tool = script.name if script.parent == REPO / "scripts" else f"megatron_lm={script}"
        raise child_failure(tool, done.returncode, done.stderr)
    return time.perf_counter() - started


def _ours(corpus: Path, tokenizer: Path, output: Path, workers: int, shards: int | None) -> list:
    command = [sys.executable, str(REPO / "scripts" / "prepare_data.py"), f"input={corpus}",
               f"output={output}", f"tokenizer={tokenizer}", f"num_proc={workers}"]
    shards = shards_for(corpus, shards) if shards else None  # the one-document run takes 1
    return command + ([f"num_shards={shards}"] if shards and shards > 1 else [])


def _theirs(tool: Path, corpus: Path, tokenizer: Path, output: Path, workers: int) -> list:
    return [sys.executable, str(tool), "--input", str(corpus), "--output-prefix", str(output),
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer),
            "--append-eod", "--json-keys", "text", "--workers", str(workers)]


def _tiny(folder: Path) -> Path:
    path = folder / "tiny.jsonl"
    path.write_text(json.dumps({"text": "one short document"}) + "\n")
    return path


# Below this share of a run spent on the corpus, the start-up's run-to-run spread (torch's
# import alone varies by a second or more here) decides the difference: the ratio is not printed.
MIN_WORK_SHARE = 0.3


def _work(make, corpus: Path, tiny: Path, folder: Path, repeats: int) -> tuple[float, float]:
    """Best wall seconds over the corpus minus the best over one document, and that
    difference's share of the corpus run."""
    def best(source: Path) -> float:
        times = []
        for index in range(repeats):
            out = folder / f"run{index}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            times.append(_timed(make(source, out / "out"), folder))
        return min(times)

    whole = best(corpus)
    work = whole - best(tiny)
    return max(1e-3, work), max(0.0, work) / whole


def work_share_problem(shares: dict[str, float]) -> str | None:
    """Why the start-up-free comparison cannot be trusted (None: it can)."""
    small = {name: share for name, share in shares.items() if share < MIN_WORK_SHARE}
    if not small:
        return None
    listed = ", ".join(f"{name} {share:.0%}" for name, share in small.items())
    return (f"the corpus is too small to time against start-up (work share of a run: {listed}; "
            f"at least {MIN_WORK_SHARE:.0%} needed): rerun with a larger max_mb=, e.g. 32")


def tokenizer_folder(tokenizer_json: Path, folder: Path) -> Path:
    """A Hugging Face folder around a tokenizer.json (what Megatron-LM's tool loads)."""
    from tokenizers import Tokenizer

    from data_prep.hf_tokenizer import EOD_CANDIDATES

    target = folder / "tokenizer"
    target.mkdir(exist_ok=True)
    shutil.copy(tokenizer_json, target / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    eos = next((t for t in EOD_CANDIDATES if tokenizer.token_to_id(t) is not None), None)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **({"eos_token": eos} if eos else {})}
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process (the driver) and of its waited-for children."""
    me, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def _in_process(corpus: Path, tokenizer: Path, folder: Path, workers: int,
                shards: int) -> tuple[float, float, float]:
    """Wall seconds of prepare() itself in this process (its imports done; workers fork), and
    the driver's CPU seconds in it when the work ran in worker processes."""
    from data_prep.config import PrepareConfig
    from data_prep.prepare import prepare

    out = folder / f"w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    cfg = PrepareConfig(input=str(corpus), output=str(out / "out"), tokenizer=str(tokenizer),
                        num_proc=workers, num_shards=shards)
    before = _cpu()
    seconds = prepare(cfg, progress=False).seconds
    after = _cpu()
    return seconds, after[0] - before[0], after[1] - before[1]


def scaling(corpus: Path, tokenizer: Path, folder: Path, tokens: int, repeats: int) -> None:
    """prepare() with 1 and 2 workers, alternated, best of the repeats (wall clock); with the
    driver's and the workers' CPU time of the 2-worker runs, the serial share (Amdahl's bound
    on two idle cores), which neighbours on a shared machine cannot distort."""
    shards = shards_for(corpus, SHARDS)
    if shards < 2:
        print("ratio 2 workers / 1 worker:         not measured: the corpus cannot be cut into "
              "2 shards with a document in each; rerun with a larger max_mb=, e.g. 1")
        return
    seconds: dict[int, list[float]] = {1: [], 2: []}
    driver = workers_cpu = 0.0
    for _ in range(repeats):
        for workers in (1, 2):
            wall, mine, theirs = _in_process(corpus, tokenizer, folder, workers, shards)
            seconds[workers].append(wall)
            if workers == 2:
                driver, workers_cpu = driver + mine, workers_cpu + theirs
    best = {w: min(v) for w, v in seconds.items()}
    print(f"prepare() num_shards={shards}: 1 worker {tokens / best[1]:,.0f} tokens/s, "
          f"2 workers {tokens / best[2]:,.0f} tokens/s (wall)")
    print(f"ratio 2 workers / 1 worker:         {best[1] / best[2]:.2f} (goal >= 1.7)")
    serial = driver / max(driver + workers_cpu, 1e-9)
    print(f"2 workers: driver {driver:.2f} CPU s, workers {workers_cpu:.2f} CPU s; serial share "
          f"{serial:.1%}, so at most {1 / (serial + (1 - serial) / 2):.2f}x on two idle cores")


def against_megatron_lm(tool: Path, corpus: Path, tokenizer: Path, folder: Path, tokens: int,
                        repeats: int, workers: int) -> None:
    tiny = _tiny(folder)
    for name in ("ours", "theirs"):
        (folder / name).mkdir()
    ours, our_share = _work(
        lambda s, o: _ours(s, tokenizer, o, workers, workers if workers > 1 else None),
        corpus, tiny, folder / "ours", repeats)
    theirs, their_share = _work(lambda s, o: _theirs(tool, s, tokenizer, o, workers), corpus,
                                tiny, folder / "theirs", repeats)
    problem = work_share_problem({"prepare_data": our_share, "Megatron-LM": their_share})
    if problem:
        print(f"ratio prepare_data / Megatron-LM:   not measured: {problem}")
    else:
        print(f"Megatron-LM preprocess_data --workers {workers}: {tokens / theirs:,.0f} "
              f"tokens/s; prepare_data num_proc={workers}: {tokens / ours:,.0f} tokens/s "
              "(wall, start-up taken off)")
        print(f"ratio prepare_data / Megatron-LM:   {theirs / ours:.2f} (goal >= 1.0)")
    same = _compare(tool, corpus, tokenizer, folder / "compare")
    print(f"one worker, same corpus and tokenizer: .bin and .idx byte-identical to "
          f"Megatron-LM's: {same}")


def _compare(tool: Path, corpus: Path, tokenizer: Path, folder: Path) -> bool:
    folder.mkdir()
    _timed(_ours(corpus, tokenizer, folder / "ours", 1, None), folder)
    _timed(_theirs(tool, corpus, tokenizer, folder / "lm", 1), folder)
    name = corpus.name.split(".")[0]
    theirs = [folder / f"lm_text_document{s}" for s in (".bin", ".idx")]
    missing = [path.name for path in theirs if not path.is_file()]
    if missing:  # it ran and wrote nothing of Megatron-LM's: another script
        raise UserError(f"megatron_lm={tool} ran but wrote no {missing[0]}, so it is not "
                        "Megatron-LM's tools/preprocess_data.py; name that file of a Megatron-LM "
                        "checkout, or leave megatron_lm unset")
    return all((folder / f"ours_{name}{path.suffix}").read_bytes() == path.read_bytes()
               for path in theirs)

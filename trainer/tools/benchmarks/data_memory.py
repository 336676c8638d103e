"""`scripts/bench_data.py memory=true`: peak resident memory per preparation worker at 1x and 10x
a corpus, measured in the same run (goal: within 20%, i.e. memory independent of corpus size).

Each size is prepared by a fresh Python process (`num_proc=2`, `num_shards=2`, the corpus written
as two files in the chosen format, so each of the two forked workers reads its own half as a
stream). That process samples the resident memory (`VmRSS` of /proc, through psutil) of each of
its workers every few milliseconds and prints the largest, and the RSS each worker started with
(what it shares with the driver: Python, torch and Megatron Core imported once), so the part
that could grow with the corpus is the difference; `RUSAGE_SELF` gives the driver's peak. (A
forked child's `ru_maxrss` starts from its parent's peak, so it cannot show a worker's own.)
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from trainer.tools.benchmarks.child_runs import child_failure

REPO = Path(__file__).resolve().parents[3]
FORMATS = ("jsonl", "gz", "zst", "parquet")
GOAL = 0.20  # the 10x figure within 20% of the 1x one
SAMPLE_S = 0.01


def write_parts(documents: list[str], folder: Path, fmt: str, times: int) -> Path:
    """`times` copies of the documents as two files of the format, in `folder`, the larger
    first: a file read as a stream (compressed, Parquet) lies wholly in the shard where it
    starts (`data_prep.shards._range_pieces`), so the second file starts the second of two
    shards only when the first holds at least half the bytes."""
    folder.mkdir(parents=True)
    halves = (documents[: len(documents) // 2], documents[len(documents) // 2:])
    for index, half in enumerate(halves):
        rows = [{"text": t} for _ in range(times) for t in half]
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"text": [r["text"] for r in rows]}),
                           folder / f"part-{index}.parquet", row_group_size=10_000)
            continue
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        path = folder / f"part-{index}.jsonl"
        if fmt == "gz":
            path.with_suffix(".jsonl.gz").write_bytes(gzip.compress(data, 6))
        elif fmt == "zst":
            import pyarrow as pa

            with pa.CompressedOutputStream(str(path) + ".zst", "zstd") as out:
                out.write(data)
        else:
            path.write_bytes(data)
    first, second = sorted(folder.iterdir())
    if first.stat().st_size < second.stat().st_size:  # swap the names (the halves' order)
        held = first.with_name("swap")
        first.rename(held)
        second.rename(first)
        held.rename(second)
    return folder


def _sample(peaks: dict[int, list[int]], stop: threading.Event) -> None:
    """Every SAMPLE_S: each worker's RSS; keep (first seen, largest) per worker."""
    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                rss = child.memory_info().rss
            except psutil.Error:
                continue
            first, most = peaks.setdefault(child.pid, [rss, rss])
            peaks[child.pid][1] = max(most, rss)
        stop.wait(SAMPLE_S)


def measure(corpus: str, tokenizer: str, output: str) -> None:
    """In the child process: prepare, then print the workers' and the driver's peaks (MiB)."""
    from data_prep.config import PrepareConfig
    from data_prep.prepare import prepare

    peaks: dict[int, list[int]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(peaks, stop), daemon=True)
    sampler.start()
    result = prepare(PrepareConfig(input=corpus, output=output, tokenizer=tokenizer,
                                   num_proc=2, num_shards=2), progress=False)
    stop.set()
    sampler.join()
    if not peaks:
        raise SystemExit("no worker process was seen")
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"worker": max(p[1] for p in peaks.values()) / 2**20,
                      "start": max(p[0] for p in peaks.values()) / 2**20,
                      "workers": len(peaks), "driver": driver, "tokens": result.tokens,
                      "seconds": result.seconds}))


def _child(corpus: Path, tokenizer: Path, output: Path) -> dict:
    code = ("import sys; from trainer.tools.benchmarks.data_memory import measure; "
            "measure(*sys.argv[1:])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(tokenizer), str(output)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode:
        raise child_failure("the preparation (data_prep.prepare)", done.returncode, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory(documents: list[str], tokenizer: Path, folder: Path, fmt: str) -> int:
    """Print both peaks and their ratio; 0 when within the goal, 1 otherwise."""
    found = {}
    for times in (1, 10):
        corpus = write_parts(documents, folder / f"corpus{times}x", fmt, times)
        found[times] = _child(corpus, tokenizer, folder / f"out{times}x" / "out")
        got = found[times]
        size = sum(p.stat().st_size for p in corpus.iterdir()) / 2**20
        print(f"{times:>2}x corpus ({size:,.1f} MiB of {fmt} in 2 files, {got['tokens']:,} "
              f"tokens, {got['seconds']:.1f} s): peak RSS per worker {got['worker']:,.1f} MiB "
              f"({got['worker'] - got['start']:+,.1f} MiB over its start, "
              f"{got['workers']} workers), driver {got['driver']:,.1f} MiB")
    ratio = found[10]["worker"] / found[1]["worker"]
    print(f"ratio peak per worker 10x / 1x:     {ratio:.2f} (goal within {GOAL:.0%}: "
          f"{1 - GOAL:.1f} to {1 + GOAL:.1f})")
    return 0 if abs(ratio - 1) <= GOAL else 1

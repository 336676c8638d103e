"""Tokens/s per core of the whole preparation against the bare tokenizer on the same
documents, in one process (`scripts/bench_data.py` is the usage). The process is pinned to one
core with the tokenizer's thread pool off (the command sets TOKENIZERS_PARALLELISM and
RAYON_NUM_THREADS before anything is imported), so both figures are per core. A `tokenizer=`
that cannot be read, a `megatron_lm=` that is not a Megatron-LM checkout's
tools/preprocess_data.py (`megatron_lm_problem`), a `vocab=` below a byte-level BPE's smallest
or `format=` without `memory=true` is one `error:` line before anything is written or timed
(`check_options`). The corpus is cut at `max_mb` MiB exactly (the stdlib's last source
file is cut short), so the size printed is the size asked for.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from recipes.config.links import resolved

BATCH = 1000


def bench_tokenizer(spec: str | None) -> Path | None:
    """The tokenizer.json `tokenizer=` names (a file, or a folder holding one), loaded once to
    be sure; None: train one. Raises one line, never the tokenizer library's traceback."""
    from plugins.protocol.errors import ConfigError

    if not spec:
        return None
    path = Path(spec).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"tokenizer={spec}: no such file; name a tokenizer.json (or a folder "
                          "holding one), or leave tokenizer unset to train one")
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(file))
    except Exception as err:  # the library raises plain Exceptions for a bad file
        raise ConfigError(f"tokenizer={spec}: {file} cannot be read as a tokenizer "
                          f"({str(err).splitlines()[0]}); name a Hugging Face tokenizer.json"
                          ) from None
    return file


MEGATRON_TOOL = Path("tools") / "preprocess_data.py"
CLONE = "git clone https://github.com/NVIDIA/Megatron-LM"


def megatron_lm_problem(tool: str | None) -> str | None:
    """`megatron_lm=` names Megatron-LM's tools/preprocess_data.py: a file (in a checkout, or
    alone: the installed megatron-core ships the `megatron` it imports) that parses as Python.
    Else the one line, said before the benchmark runs rather than as the tool's failure after
    it (a checkout's folder is answered with its tool's path)."""
    if not tool:
        return None
    path = Path(tool).expanduser()
    if path.is_dir():
        inside = path / MEGATRON_TOOL
        fix = (f"name its tool: megatron_lm={inside}" if inside.is_file()
               else f"name tools/preprocess_data.py of a Megatron-LM checkout ({CLONE})")
        return f"megatron_lm={tool} is a folder, not Megatron-LM's {MEGATRON_TOOL}; {fix}"
    if not path.is_file():
        return (f"megatron_lm={tool}: no such file; name {MEGATRON_TOOL} of a Megatron-LM "
                f"checkout ({CLONE}), or leave megatron_lm unset")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except (OSError, SyntaxError, ValueError) as err:
        return (f"megatron_lm={tool} is not Megatron-LM's {MEGATRON_TOOL} (it cannot be read "
                f"as Python: {type(err).__name__}: {getattr(err, 'msg', None) or err}); name "
                f"that file of a Megatron-LM checkout ({CLONE}), or leave megatron_lm unset")
    return None


MIN_VOCAB = 257  # a byte-level BPE: the 256 byte symbols and <|endoftext|> (hf_tokenizer.py)


def check_options(options: dict) -> Path | None:
    """The options' mistakes, one line each, before anything is read, written or timed; the
    tokenizer.json `tokenizer=` names (None: train one)."""
    from plugins.protocol.errors import ConfigError

    if not options.get("memory") and options.get("format", "jsonl") != "jsonl":
        raise ConfigError(f"format={options['format']} applies only with memory=true (the "
                          "memory benchmark's corpus files); add memory=true or drop format=")
    problem = megatron_lm_problem(options.get("megatron_lm"))
    if problem:
        raise ConfigError(problem)
    named = bench_tokenizer(options.get("tokenizer"))
    vocab = options.get("vocab")
    if named is None and vocab is not None and int(vocab) < MIN_VOCAB:
        raise ConfigError(f"vocab={vocab} is below {MIN_VOCAB}, the fewest tokens of a "
                          f"byte-level BPE (256 byte symbols and <|endoftext|>); give vocab="
                          f"{MIN_VOCAB} or more, e.g. vocab=4096")
    return named


def pin_one_core() -> int:
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def write_corpus(options: dict[str, str], folder: Path) -> tuple[Path, list[str]]:
    import json

    from data_prep.corpus import corpus_documents

    source = "python_stdlib" if options["corpus"] == "stdlib" else "synthetic"
    documents = cut(corpus_documents(source, int(options["max_mb"] * 2**20)),
                    int(options["max_mb"] * 2**20))
    if not documents:
        from plugins.protocol.errors import ConfigError

        raise ConfigError(f"max_mb={options['max_mb']} holds no text; give max_mb=0.01 or more")
    path = folder / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as file:
        for text in documents:
            file.write(json.dumps({"text": text}) + "\n")
    return path, documents


def cut(documents, max_bytes: int) -> list[str]:
    """The documents with text, up to `max_bytes` of UTF-8 in all: the corpus ends at whole
    documents, so the last one (a whole stdlib source file) is cut short where it would pass
    the size (at a character boundary)."""
    kept, total = [], 0
    for text in documents:
        if not text.strip():
            continue
        data = text.encode("utf-8")
        if total + len(data) > max_bytes:
            text = data[:max_bytes - total].decode("utf-8", errors="ignore")
            if text.strip():
                kept.append(text)
            break
        kept.append(text)
        total += len(data)
    return kept


def bare(tokenizer, documents: list[str], method: str) -> tuple[float, int]:
    encode = getattr(tokenizer, method)
    started = time.process_time()
    tokens = 0
    for i in range(0, len(documents), BATCH):
        tokens += sum(len(e) for e in encode(documents[i:i + BATCH]))
    return time.process_time() - started, tokens


def pipeline(corpus: Path, tokenizer: Path, folder: Path) -> tuple[float, int]:
    import shutil

    from data_prep.config import PrepareConfig
    from data_prep.prepare import prepare

    out = folder / "bench"  # a fresh output: a complete one would only be checked, not written
    shutil.rmtree(out, ignore_errors=True)
    cfg = PrepareConfig(input=str(corpus), output=str(out / "bench"),
                        tokenizer=str(tokenizer), num_proc=1)
    started = time.process_time()
    result = prepare(cfg, progress=False)
    return time.process_time() - started, result.tokens - result.documents


def run_bench_data(options: dict) -> int:
    named = check_options(options)
    core = pin_one_core()
    from tokenizers import Tokenizer

    from data_prep.hf_tokenizer import train_byte_level_bpe
    from data_prep.prepare import dataset_dtype

    dataset_dtype(256)  # import Megatron before anything is timed
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        corpus, documents = write_corpus(options, folder)
        size = sum(len(d.encode()) for d in documents)
        print(f"corpus: {len(documents):,} documents, {size / 2**20:.2f} MiB ({options['corpus']})"
              f"; pinned to core {core}")
        tokenizer_file = named
        if tokenizer_file is None:
            started = time.perf_counter()
            trained = train_byte_level_bpe(documents, int(options["vocab"]))
            tokenizer_file = folder / "tokenizer.json"
            trained.save(str(tokenizer_file))
            print(f"trained a byte-level BPE of {trained.get_vocab_size():,} tokens in "
                  f"{time.perf_counter() - started:.1f} s (not timed below)")
        if options.get("memory"):
            from trainer.tools.benchmarks.data_memory import memory

            os.sched_setaffinity(0, range(os.cpu_count() or 1))
            return memory(documents, tokenizer_file, folder / "memory", options["format"])
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        pipeline(corpus, tokenizer_file, folder)  # warm-up: first-call costs of datasets
        times: dict[str, list[float]] = {"encode_batch": [], "encode_batch_fast": [],
                                         "prepare": []}
        counts: dict[str, int] = {}
        for _ in range(int(options["repeats"])):
            for method in ("encode_batch", "encode_batch_fast"):
                seconds, counts[method] = bare(tokenizer, documents, method)
                times[method].append(seconds)
            seconds, counts["prepare"] = pipeline(corpus, tokenizer_file, folder)
            times["prepare"].append(seconds)
        report(times, counts)
        wall_clock(options, corpus, tokenizer_file, folder, counts["prepare"])
    return 0


def wall_clock(options: dict, corpus: Path, tokenizer_file: Path, folder: Path,
               tokens: int) -> None:
    """The workers' scaling and Megatron-LM's tool, on every core (trainer/tools/
    bench_data_scale.py)."""
    from trainer.tools.benchmarks import data_scale as scale

    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    hf_folder = scale.tokenizer_folder(tokenizer_file, folder)
    repeats = max(1, int(options["repeats"]) // 2)
    (folder / "scaling").mkdir()
    scale.scaling(corpus, hf_folder, folder / "scaling", tokens, repeats)
    if options.get("megatron_lm"):
        (folder / "megatron_lm").mkdir()
        scale.against_megatron_lm(resolved(options["megatron_lm"]), corpus, hf_folder,
                                  folder / "megatron_lm", tokens, repeats,
                                  int(options["workers"]))


def report(times: dict[str, list[float]], counts: dict[str, int]) -> None:
    """Best and median of the repeats; the ratios use the best (on a shared machine the
    neighbours only ever add time, even CPU time, through caches and shared cores)."""
    if len(set(counts.values())) != 1:
        raise SystemExit(f"token counts differ: {counts}")
    tokens = counts["prepare"]
    rate = {name: tokens / min(values) for name, values in times.items()}
    labels = {"encode_batch": "bare tokenizer encode_batch", "encode_batch_fast":
              "bare tokenizer encode_batch_fast", "prepare": "prepare() whole pipeline"}
    print(f"{'measure':<34}{'best CPU s':>11}{'median':>8}{'tokens/s per core':>19}")
    for name, values in times.items():
        print(f"{labels[name]:<34}{min(values):>11.2f}{statistics.median(values):>8.2f}"
              f"{rate[name]:>19,.0f}")
    print(f"tokens: {tokens:,} (EOD excluded), same count in all three")
    print(f"ratio pipeline / encode_batch:      {rate['prepare'] / rate['encode_batch']:.2f} "
          "(goal >= 0.8)")
    print(f"ratio pipeline / encode_batch_fast: {rate['prepare'] / rate['encode_batch_fast']:.2f}")



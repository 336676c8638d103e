"""Benchmark: tokens/s per core of the whole preparation vs the bare tokenizer, in one run.

usage: python scripts/bench_data.py [corpus=stdlib|synthetic] [max_mb=N] [vocab=N] [repeats=N]
                                    [tokenizer=PATH]

    python scripts/bench_data.py                        # 8 MiB of the stdlib's sources
    python scripts/bench_data.py corpus=synthetic max_mb=8 vocab=4096 repeats=5

The corpus (one document per source file, or synthetic word salad) is written as JSONL; a
byte-level BPE of `vocab` tokens is trained on it first (untimed) unless tokenizer= names one.
The process is pinned to one core and the tokenizer's thread pool is off, so both figures are
per core. Each repeat times, on the same documents: the bare tokenizer (`encode_batch` and
`encode_batch_fast` over the documents already in memory, batches of 1000), and the whole
`prepare()` with num_proc=1 (read the JSONL through datasets, tokenize through its map, append
EOD, write the Megatron dataset, manifest and tokenizer). Best and median of the repeats are
printed, with the ratio pipeline / encode_batch of the best (goal: >= 0.8). Tokens exclude the
EOD ids, so all three count the same. Times are the process's CPU time (all its threads, on the
one core): on a shared machine wall time measures the neighbours as much as the code; with
num_proc=1 no child process does work.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core: no Rust thread pool
os.environ["RAYON_NUM_THREADS"] = "1"

from data_prep.config import split_argument  # noqa: E402
from plugins.protocol.errors import ConfigError  # noqa: E402

DEFAULTS = {"corpus": "stdlib", "max_mb": "8", "vocab": "32000", "repeats": "5",
            "tokenizer": ""}
BATCH = 1000


def parse(argv: list[str]) -> dict[str, str]:
    options = dict(DEFAULTS)
    for text in argv:
        key, value = split_argument(text)
        if key not in options:
            raise ConfigError(f"unknown key '{key}'; the keys are {', '.join(DEFAULTS)}")
        options[key] = value
    if options["corpus"] not in ("stdlib", "synthetic"):
        raise ConfigError(f"corpus={options['corpus']} must be stdlib or synthetic")
    for key in ("max_mb", "vocab", "repeats"):
        if not options[key].isdigit() or int(options[key]) < 1:
            raise ConfigError(f"{key}={options[key]} must be a positive whole number, "
                              f"e.g. {key}={DEFAULTS[key]}")
    return options


def pin_one_core() -> int:
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def write_corpus(options: dict[str, str], folder: Path) -> tuple[Path, list[str]]:
    import json

    from data_prep.corpus import corpus_documents

    source = "python_stdlib" if options["corpus"] == "stdlib" else "synthetic"
    documents = [d for d in corpus_documents(source, int(options["max_mb"]) << 20) if d.strip()]
    path = folder / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as file:
        for text in documents:
            file.write(json.dumps({"text": text}) + "\n")
    return path, documents


def bare(tokenizer, documents: list[str], method: str) -> tuple[float, int]:
    encode = getattr(tokenizer, method)
    started = time.process_time()
    tokens = 0
    for i in range(0, len(documents), BATCH):
        tokens += sum(len(e) for e in encode(documents[i:i + BATCH]))
    return time.process_time() - started, tokens


def pipeline(corpus: Path, tokenizer: Path, folder: Path) -> tuple[float, int]:
    from data_prep.config import PrepareConfig
    from data_prep.prepare import prepare

    cfg = PrepareConfig(input=str(corpus), output=str(folder / "bench"),
                        tokenizer=str(tokenizer), num_proc=1)
    started = time.process_time()
    result = prepare(cfg, progress=False)
    return time.process_time() - started, result.tokens - result.documents


def run(options: dict[str, str]) -> None:
    core = pin_one_core()
    from tokenizers import Tokenizer

    from data_prep.prepare import dataset_dtype
    from data_prep.tokenizers import train_byte_level_bpe

    dataset_dtype(256)  # import Megatron before anything is timed
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        corpus, documents = write_corpus(options, folder)
        size = sum(len(d.encode()) for d in documents)
        print(f"corpus: {len(documents):,} documents, {size / 2**20:.1f} MiB ({options['corpus']})"
              f"; pinned to core {core}")
        tokenizer_file = Path(options["tokenizer"]) if options["tokenizer"] else None
        if tokenizer_file is None:
            started = time.perf_counter()
            trained = train_byte_level_bpe(documents, int(options["vocab"]))
            tokenizer_file = folder / "tokenizer.json"
            trained.save(str(tokenizer_file))
            print(f"trained a byte-level BPE of {trained.get_vocab_size():,} tokens in "
                  f"{time.perf_counter() - started:.1f} s (not timed below)")
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


def main(argv: list[str]) -> int:
    if any(arg in ("--help", "-h", "help") for arg in argv):
        print(__doc__)
        return 0
    try:
        options = parse(argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run(options)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

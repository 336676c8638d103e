"""Benchmark: tokens/s per core of the whole preparation vs the bare tokenizer, in one run.

usage: python scripts/bench_data.py [corpus=stdlib|synthetic] [max_mb=N] [vocab=N] [repeats=N]
                                    [tokenizer=PATH] [megatron_lm=PATH] [workers=N]
                                    [memory=true [format=jsonl|gz|zst|parquet]]

    python scripts/bench_data.py                        # 8 MiB of the stdlib's sources
    python scripts/bench_data.py corpus=synthetic max_mb=8 vocab=4096 repeats=5
    python scripts/bench_data.py corpus=synthetic max_mb=32 vocab=4096 repeats=2 \\
        megatron_lm=/tmp/Megatron-LM/tools/preprocess_data.py
    python scripts/bench_data.py memory=true corpus=synthetic max_mb=4 vocab=4096 format=gz

memory=true measures instead the peak resident memory per worker (2 workers, 2 shards, a fresh
process per size) at 1x and 10x the corpus, and prints both and their ratio (goal: within 20%;
trainer/tools/benchmarks/data_memory.py).

Then, on every core and by wall clock (each tool's start-up taken off): tokens/s of
prepare_data with 2 workers against 1 (up to 4 shards, as many as get a document; goal >= 1.7;
with the driver's share of the CPU time, the serial part that bounds the ratio on idle cores),
and with megatron_lm= (the
one file from the Megatron-LM repository) that tool on the same corpus, tokenizer folder and
`workers`, against prepare_data with as many workers (goal >= 1.0), plus a byte comparison of
both tools' .bin/.idx with one worker each (trainer/tools/benchmarks/data_scale.py).

The corpus (one document per source file, or synthetic word salad) is written as JSONL; a
byte-level BPE of `vocab` tokens is trained on it first (untimed) unless tokenizer= names one.
The process is pinned to one core and the tokenizer's thread pool is off, so both figures are
per core. Each repeat times, on the same documents: the bare tokenizer (`encode_batch` and
`encode_batch_fast` over the documents already in memory, batches of 1000), and the whole
`prepare()` with num_proc=1 (read the JSONL through datasets, tokenize the shard, append
EOD, write the Megatron dataset, its record, the manifest and the tokenizer folder). Best and
median of the repeats are printed, with the ratio pipeline / encode_batch of the best (goal:
>= 0.8). Tokens exclude the EOD ids, so all three count the same. Times are the process's CPU
time (all its threads, on the one core): on a shared machine wall time measures the neighbours
as much as the code; with num_proc=1 no child process does work.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_DATA  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCH_DATA))

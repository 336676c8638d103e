"""Benchmark: exact best-fit-decreasing packing (data_prep/packing.py) against naive next-fit.

usage: python scripts/bench_packing.py [documents=N] [seed=S]

    python scripts/bench_packing.py                    # 1,000,000 documents, seed 0
    python scripts/bench_packing.py documents=20000 seed=3

Draws log-normal document lengths (median 300 tokens, sigma 1.0, clipped to 1..8192), packs them
at 4096 and 8192 tokens with long documents split, on one thread, and prints per pack size the
best of 3 timed runs after a warm-up (wall-clock seconds per 1M documents, and the CPU seconds
of that run: wall-clock well above them means the process waited for a busy core), packs, the
lower bound ceil(tokens / pack size), their ratio and the efficiency, then next-fit in document
order measured the same way. Goals: <= 0.1 s per 1M documents and <= 1.0001 x the lower bound.
Then the trainer's order of a packed blend's rows, as many rows as documents in three sources
(weights 0.5 / 0.3 / 0.2): Megatron's rule written to the files every rank maps, against the
earlier rule in Python (`data.pack_order=v1`), best of 3 each, and their ratio. Goal: <= 0.1 s
per 1M rows.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_PACKING  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCH_PACKING))

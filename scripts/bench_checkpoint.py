"""Benchmark: checkpoint save and load time next to `dd conv=fsync` of the same bytes, the
training-step stall with checkpoint.async_save on and off, and where each save's time goes.

usage: python scripts/bench_checkpoint.py [size=tiny|100m|both] [recipe=NAME | config=FILE]
                                          [repeats=N] [steps=N] [overrides]

    python scripts/bench_checkpoint.py                        # tiny, then ~100M, both DP2
    python scripts/bench_checkpoint.py size=100m repeats=2
    python scripts/bench_checkpoint.py size=tiny checkpoint.optimizer_format=fully_reshardable

size=tiny runs the recipe as it is (default tiny_dp2_distopt: 2 ranks, distributed optimizer);
size=100m raises its model to about 100M parameters (12 layers, hidden 768, vocabulary 20480,
one 128-token sample per rank per step); both (the default) runs tiny, then 100m. Each
repeat saves through the trainer's save_checkpoint, writes the same bytes with dd on rank 0,
and loads them back; the first save of a process is reported apart. Then normal steps are
timed against three steps that start a save with checkpoint.async_save=true (the trainer's own
path, trainer/tools/benchmarks/checkpoint.py); the stall with async off is the synchronous save.
Goals: save <= 2 x dd + 0.5 s, load <= 2 x dd, step stall with async on <= 0.2 s.
Prints a table, the phases of saves, a load and async starts, and one JSON line (also
written to <run dir>/bench_checkpoint.json). The ~100M run needs about 6 GB of memory per
rank and several minutes on 2 cores.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_CHECKPOINT  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # the checkpoint writer spawns processes: keep this guard
    sys.exit(main(BENCH_CHECKPOINT))

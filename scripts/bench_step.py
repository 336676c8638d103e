"""Benchmark: this trainer's step time vs a bare Megatron Core loop (same model, layout, data).

usage: python scripts/bench_step.py [recipe=NAME | config=FILE] [steps=N] [warmup=N] [overrides]

    python scripts/bench_step.py                       # the default recipe on 4 local ranks
    python scripts/bench_step.py recipe=tiny_dp1 steps=30 warmup=5 model.hidden_size=256

Every other argument is a recipe argument as for pretrain.py. Prints the medians of our step
and of the bare step (which reads its batch from the same dataset), their ratio, and the median
and spread of the ratios of the interleaved pairs (steps >= 5; goal: <= 1.02 on the default
recipe); then the same against the bare step on a batch in memory, the floor with no read.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_STEP  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCH_STEP))

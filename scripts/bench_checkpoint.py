"""Benchmark: checkpoint save and load time next to `dd conv=fsync` of the same bytes, the
training-step stall of Megatron's asynchronous save, and where each save's time goes.

usage: python scripts/bench_checkpoint.py [size=tiny|100m|both] [recipe=NAME | config=FILE]
                                          [repeats=N] [steps=N] [overrides]

    python scripts/bench_checkpoint.py                        # tiny, then ~100M, both DP2
    python scripts/bench_checkpoint.py size=100m repeats=2
    python scripts/bench_checkpoint.py size=tiny checkpoint.optimizer_format=dp_reshardable

size=tiny runs the recipe as it is (default tiny_dp2_distopt: 2 ranks, distributed optimizer);
size=100m raises its model to about 100M parameters (12 layers, hidden 768, vocabulary 20480,
one 128-token sample per rank per step); both (the default) runs tiny, then 100m. Each
repeat saves through the trainer's save_checkpoint, writes the same bytes with dd on rank 0,
and loads them back; the first save of a process is reported apart. Then normal steps are
timed against steps that start an async save: one with Megatron's defaults, two tuned (see
trainer/tools/bench_checkpoint.py). Goals (issue #7): save <= 2 x dd + 0.5 s, load <= 2 x dd, async
stall <= 0.2 s. Prints a table, the phases of saves, a load and async starts, and one JSON
line (also written to <run dir>/bench_checkpoint.json). The ~100M run needs about 6 GB of
memory per rank and several minutes on 2 cores.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.pipeline import main, under_launcher  # noqa: E402
from trainer.tools.bench_checkpoint import BENCH_CHECKPOINT  # noqa: E402

DEFAULT_RECIPE = "recipe=tiny_dp2_distopt"
SIZE_100M = [
    "model.num_layers=12", "model.hidden_size=768", "model.ffn_hidden_size=3072",
    "model.num_attention_heads=12", "model.vocab_size=20480",
    "train.micro_batch_size=1", "train.global_batch_size=2",
]
SIZES = {"tiny": [[]], "100m": [SIZE_100M], "both": [[], SIZE_100M]}


def run_sizes(argv: list[str]) -> int:
    """Run the benchmark once per requested size (each launches its own ranks)."""
    size = next((a.split("=", 1)[1] for a in argv if a.startswith("size=")), "both")
    rest = [a for a in argv if not a.startswith("size=")]
    if size not in SIZES:
        print(f"error: size={size} must be tiny, 100m or both", file=sys.stderr)
        return 2
    if any(a in ("--help", "-h", "help") for a in rest):
        return main(BENCH_CHECKPOINT, rest)
    if not any(a.startswith(("recipe=", "config=")) for a in rest):
        rest = [DEFAULT_RECIPE, *rest]
    for overrides in SIZES[size]:
        code = main(BENCH_CHECKPOINT, [*rest, *overrides])
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(BENCH_CHECKPOINT) if under_launcher() else run_sizes(sys.argv[1:]))

"""Benchmark: the layout search (pruned, memoised) against the exhaustive search, same run.

usage: python scripts/bench_search.py [recipe=NAME | config=FILE] [cluster=FILE] [top=N]
                                      [repeats=N] [overrides]

    python scripts/bench_search.py recipe=llama3_70b_tp4_pp4_cp2_vpp5_dp2 \\
        cluster=conf/cluster/h100_80gb_8x8.yaml
    python scripts/bench_search.py recipe=tiny_tp2_pp2 cluster=conf/cluster/cpu_local.yaml repeats=1

Runs the exhaustive search (every layout planned in full, nothing memoised: the reference)
and the search as `scripts/plan.py search=true` runs it, in turn, `repeats` times each, and
prints each one's median wall-clock and CPU seconds, how many layouts each planned, the ratio
search / exhaustive, and whether both rank the same top N layouts with the same step times and
peaks (exit 1 when they do not). Every other argument is a recipe argument as for plan.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import BENCH_SEARCH  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCH_SEARCH))

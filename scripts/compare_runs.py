"""Overlay the loss curves of several runs in one picture.

usage: python scripts/compare_runs.py RUN_DIR [RUN_DIR ...] [out=FILE.png]

    python scripts/compare_runs.py runs/tiny_dp1-20261130-101500 runs/tiny_tp2_pp2-20261130-103000
    python scripts/compare_runs.py runs/a runs/b out=a_vs_b.png

Reads each run's metrics.jsonl and draws train loss (solid), held-out loss (dashed, markers)
and the learning rate, one colour per run, with matplotlib's Agg backend (no display needed).
The picture goes to out= (default compare_runs.png in the current directory). Each run is
labelled by its folder's name, or where two names collide by the shortest path that tells them
apart (sweepA/G1, sweepB/G1); a directory given twice is refused. A damaged metrics.jsonl line
is refused naming file and line; a last line cut short by a killed run is skipped with a note.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import COMPARE_RUNS  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(COMPARE_RUNS))

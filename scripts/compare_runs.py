"""Overlay the loss curves of several runs in one picture.

usage: python scripts/compare_runs.py RUN_DIR [RUN_DIR ...] [out=FILE.png]

    python scripts/compare_runs.py runs/tiny_dp1-20261130-101500 runs/tiny_tp2_pp2-20261130-103000
    python scripts/compare_runs.py runs/a runs/b out=a_vs_b.png

Reads each run's metrics.jsonl and draws train loss (solid), held-out loss (dashed, markers)
and the learning rate, one colour per run, with matplotlib's Agg backend (no display needed).
The picture goes to out= (default compare_runs.png in the current directory).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plugins.logging.curves import plot_curves, read_run  # noqa: E402
from plugins.protocol.errors import (
    ConfigError,  # noqa: E402
    UserError,  # noqa: E402
)


def compare(argv: list[str]) -> Path:
    """Draw the runs named in argv; returns the PNG's path."""
    out, run_dirs = Path("compare_runs.png"), []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key == "out":
            if not value.endswith(".png"):
                raise ConfigError(f"out={value} must name a .png file, e.g. out=compare.png")
            out = Path(value)
        elif sep:
            raise ConfigError(f"unknown option {key}=; the only option is out=FILE.png "
                              "(run directories are given without a key)")
        else:
            run_dirs.append(Path(arg))
    if not run_dirs:
        raise ConfigError("no run directory given; usage: python scripts/compare_runs.py "
                          "RUN_DIR [RUN_DIR ...] [out=FILE.png]")
    runs = [read_run(run_dir) for run_dir in run_dirs]
    title = " vs ".join(run.name for run in runs)
    return plot_curves(runs, out, title if len(title) < 90 else f"{len(runs)} runs")


def main(argv: list[str]) -> int:
    if any(arg in ("--help", "-h", "help") for arg in argv):
        print(__doc__.strip())
        return 0
    try:
        path = compare(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

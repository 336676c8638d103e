"""Several runs' loss curves in one picture (`scripts/compare_runs.py` is the usage), drawn with
the logging plugin's own curve code from each run's metrics.jsonl."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from plugins.logging.curves import plot_curves, read_run
from plugins.protocol.errors import ConfigError


def compare_runs(run_dirs: Sequence[str], out: str) -> Path:
    """Draw the runs in `run_dirs` into the PNG `out`; returns its path."""
    if not out.endswith(".png"):
        raise ConfigError(f"out={out} must name a .png file, e.g. out=compare.png")
    named = [text for text in run_dirs if "=" in text]
    if named:
        raise ConfigError(f"unknown option {named[0].partition('=')[0]}=; the only option is "
                          "out=FILE.png (run directories are given without a key)")
    if not run_dirs:
        raise ConfigError("no run directory given; usage: python scripts/compare_runs.py "
                          "RUN_DIR [RUN_DIR ...] [out=FILE.png]")
    runs = [read_run(Path(run_dir)) for run_dir in run_dirs]
    title = " vs ".join(run.name for run in runs)
    return plot_curves(runs, Path(out), title if len(title) < 90 else f"{len(runs)} runs")

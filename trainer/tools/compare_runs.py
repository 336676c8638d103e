"""Several runs' loss curves in one picture (`scripts/compare_runs.py` is the usage), drawn with
the logging plugin's own curve code from each run's metrics.jsonl, every line checked
(`plugins/protocol/metrics_file.py`). The same directory given twice is refused; runs whose
folder names collide are labelled by the shortest path suffix that tells them apart
(`sweepA/G1`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from plugins.logging.curves import plot_curves, read_run
from plugins.protocol.errors import ConfigError
from recipes.config.links import resolved


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
    check_distinct(run_dirs)
    runs = [read_run(Path(run_dir), label)
            for run_dir, label in zip(run_dirs, run_labels(run_dirs), strict=True)]
    title = " vs ".join(run.name for run in runs)
    try:
        return plot_curves(runs, Path(out), title if len(title) < 90 else f"{len(runs)} runs")
    except OSError as error:  # checked writable before; a disk that filled since, a quota
        raise ConfigError(f"out={out} could not be written ({error.strerror or error}); free "
                          "space there, or name a .png file on another file system") from None


def check_distinct(run_dirs: Sequence[str]) -> None:
    """Refuse a run directory given twice (under any spelling: `runs/a`, `./runs/a/`, a link)."""
    seen: dict[Path, str] = {}
    for run_dir in run_dirs:
        key = resolved(run_dir)
        if key in seen:
            again = "" if seen[key] == run_dir else f" (again as {run_dir})"
            raise ConfigError(f"{seen[key]} is given twice{again}; give each run directory once")
        seen[key] = run_dir


def run_labels(run_dirs: Sequence[str]) -> list[str]:
    """Each run's label: its folder's name, or where two names collide the shortest path suffix
    that tells it from every other run (`sweepA/G1`, `sweepB/G1`)."""
    parts = [Path(os.path.abspath(run_dir)).parts for run_dir in run_dirs]

    def suffix(index: int, length: int) -> tuple[str, ...]:
        return parts[index][-length:]

    labels = []
    for index, own in enumerate(parts):
        length = 1
        while length < len(own) and any(suffix(other, length) == suffix(index, length)
                                         for other in range(len(parts)) if other != index):
            length += 1
        labels.append(str(Path(*suffix(index, length))))
    return labels

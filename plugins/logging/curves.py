"""Loss curves as a picture: train and held-out loss over steps, and the learning rate.

One drawing serves both the end of a run (the logging plugin, from the hooks' figures) and
`scripts/compare_runs.py` (several runs, each read from its metrics.jsonl): what a person would
rather look at than read. matplotlib draws with its Agg backend (no display needed).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from plugins.protocol.errors import UserError
from plugins.protocol.metrics_file import METRICS_FILE, PASS_RUNS, parse_metrics


@dataclass
class Curves:
    """One run's curves: (step, value) pairs."""

    name: str
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    heldout_loss: list[tuple[int, float]] = field(default_factory=list)
    lr: list[tuple[int, float]] = field(default_factory=list)
    # A run in phases: (step before the phase's first step, its name) where each phase starts,
    # and per blend source its share of the tokens taken so far, per step.
    boundaries: list[tuple[int, str]] = field(default_factory=list)
    source_shares: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def add_step(self, step: int, loss: float, lr: float, phase_name: str | None = None,
                 source_tokens: dict[str, int] | None = None) -> None:
        """One training step's figures (a phase name that changes marks a boundary)."""
        self.train_loss.append((step, loss))
        self.lr.append((step, lr))
        if phase_name is not None and (not self.boundaries or
                                       self.boundaries[-1][1] != phase_name):
            self.boundaries.append((step - 1, phase_name))
        total = sum((source_tokens or {}).values())
        for name, tokens in (source_tokens or {}).items():
            self.source_shares.setdefault(name, []).append((step, tokens / total))

    def add_record(self, record: dict) -> None:
        """Take one metrics.jsonl record (train and held-out ones; others are ignored)."""
        if record.get("kind") == "train":
            self.add_step(record["step"], record["loss"], record["lr"],
                          record.get("phase_name"), record.get("source_tokens"))
        elif record.get("kind") == "heldout":
            self.heldout_loss.append((record["step"], record["loss"]))


def read_run(run_dir: Path, label: str | None = None) -> Curves:
    """A run's curves from `<run_dir>/metrics.jsonl`, named `label` (default: the folder's
    name); every line checked (`metrics_file.py`): damage is one line, a last line cut short
    by a killed run is skipped with a note on stderr."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} has no {METRICS_FILE}; {PASS_RUNS} (runs/<recipe>-<time>)")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"{path} cannot be read ({error.strerror}); {PASS_RUNS}") from None
    records, note = parse_metrics(path, data)
    if note:
        print(note, file=sys.stderr)
    curves = Curves(name=label or Path(run_dir).name)
    for record in records:
        curves.add_record(record)
    if not curves.train_loss and not curves.heldout_loss:
        raise UserError(f"{path} holds no train or held-out loss yet; pass a run that has "
                        "trained at least one step")
    return curves


def _finite(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    kept = [(step, value) for step, value in points if math.isfinite(value)]
    return [s for s, _ in kept], [v for _, v in kept]


def _mark_boundaries(run: Curves, axes: list, colour: str) -> None:
    """A dotted line where each phase after the first starts, named on the loss axis."""
    for step, name in run.boundaries[1:]:
        for axis in axes:
            axis.axvline(step, color=colour, linestyle=":", alpha=0.8)
        axes[0].annotate(name, (step, 1.0), xycoords=("data", "axes fraction"),
                         xytext=(3, -12), textcoords="offset points", fontsize="small",
                         color=colour)


def _plot_shares(runs: list[Curves], axis) -> None:
    for index, run in enumerate(runs):
        for number, (name, points) in enumerate(sorted(run.source_shares.items())):
            label = name if len(runs) == 1 else f"{run.name} {name}"
            axis.plot(*_finite(points), color=f"C{(index + number) % 10}", label=label)
    axis.set_ylabel("token share")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize="x-small", loc="center right")


def plot_curves(runs: list[Curves], path: Path, title: str) -> Path:
    """Draw the runs' losses (train solid, held-out dashed with markers) above their learning
    rates, one colour per run, into a PNG at `path`; phase boundaries as dotted lines, and
    where a run trains on several blend sources each source's share of the tokens so far."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    shares = any(len(run.source_shares) > 1 for run in runs)
    heights = [3, 1, 1] if shares else [3, 1]
    figure, axes = pyplot.subplots(len(heights), 1, sharex=True, figsize=(8, 6 + 2 * shares),
                                   gridspec_kw={"height_ratios": heights})
    loss_axis, lr_axis = axes[0], axes[1]
    for index, run in enumerate(runs):
        colour = f"C{index % 10}"
        loss_axis.plot(*_finite(run.train_loss), color=colour, label=f"{run.name} train")
        if run.heldout_loss:
            loss_axis.plot(*_finite(run.heldout_loss), color=colour, linestyle="--",
                           marker="o", label=f"{run.name} held-out")
        lr_axis.plot(*_finite(run.lr), color=colour)
        _mark_boundaries(run, list(axes), colour)
    if shares:
        _plot_shares(runs, axes[2])
    loss_axis.set_ylabel("loss per token")
    loss_axis.set_title(title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend(fontsize="small")
    lr_axis.set_ylabel("learning rate")
    axes[-1].set_xlabel("step")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # a full disk leaves no half picture
    try:
        figure.savefig(partial, dpi=100, format="png")
        os.replace(partial, path)
    finally:
        pyplot.close(figure)
        partial.unlink(missing_ok=True)
    return path

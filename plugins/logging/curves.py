"""Loss curves as a picture: train and held-out loss over steps, and the learning rate.

One drawing serves both the end of a run (the logging plugin, from the hooks' figures) and
`scripts/compare_runs.py` (several runs, each read from its metrics.jsonl): what a person would
rather look at than read. matplotlib draws with its Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from plugins.protocol.errors import UserError


@dataclass
class Curves:
    """One run's curves: (step, value) pairs."""

    name: str
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    heldout_loss: list[tuple[int, float]] = field(default_factory=list)
    lr: list[tuple[int, float]] = field(default_factory=list)

    def add_record(self, record: dict) -> None:
        """Take one metrics.jsonl record (train and held-out ones; others are ignored)."""
        if record.get("kind") == "train":
            self.train_loss.append((record["step"], record["loss"]))
            self.lr.append((record["step"], record["lr"]))
        elif record.get("kind") == "heldout":
            self.heldout_loss.append((record["step"], record["loss"]))


def read_run(run_dir: Path) -> Curves:
    """A run's curves from `<run_dir>/metrics.jsonl`; a missing or empty file is one line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir} has no metrics.jsonl; pass run directories written by "
                          "scripts/pretrain.py (runs/<recipe>-<time>)")
    curves = Curves(name=Path(run_dir).name)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            curves.add_record(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise UserError(f"{path}:{number} is not a metrics record ({error}); "
                              "pass run directories written by scripts/pretrain.py") from None
    if not curves.train_loss and not curves.heldout_loss:
        raise UserError(f"{path} holds no train or held-out loss yet; pass a run that has "
                          "trained at least one step")
    return curves


def _finite(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    kept = [(step, value) for step, value in points if math.isfinite(value)]
    return [s for s, _ in kept], [v for _, v in kept]


def plot_curves(runs: list[Curves], path: Path, title: str) -> Path:
    """Draw the runs' losses (train solid, held-out dashed with markers) above their learning
    rates, one colour per run, into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (loss_axis, lr_axis) = pyplot.subplots(
        2, 1, sharex=True, figsize=(8, 6), gridspec_kw={"height_ratios": [3, 1]})
    for index, run in enumerate(runs):
        colour = f"C{index % 10}"
        loss_axis.plot(*_finite(run.train_loss), color=colour, label=f"{run.name} train")
        if run.heldout_loss:
            loss_axis.plot(*_finite(run.heldout_loss), color=colour, linestyle="--",
                           marker="o", label=f"{run.name} held-out")
        lr_axis.plot(*_finite(run.lr), color=colour)
    loss_axis.set_ylabel("loss per token")
    loss_axis.set_title(title)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend(fontsize="small")
    lr_axis.set_ylabel("learning rate")
    lr_axis.set_xlabel("step")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path

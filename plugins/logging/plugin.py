"""Writes the run's figures to TensorBoard and W&B, and its loss curve, from rank 0.

Every figure the hooks carry is already reduced over the world, so rank 0 alone writes them:
no duplicates, no collective. Each writer gets the same scalars (`scalars.py`: every numeric
field of `StepMetrics` and its `extra`, every numeric field of `EvalResult`), which are the
values metrics.jsonl records. A writer that fails is dropped with one line; the run goes on.
The loss curve is drawn from the run's metrics.jsonl, so a resumed run's picture holds the
whole run, not only the steps since its last start.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from plugins.logging.curves import Curves, plot_curves, read_run
from plugins.logging.scalars import tagged
from plugins.logging.writers import TensorBoardWriter, WandbWriter
from plugins.protocol.errors import UserError
from plugins.protocol.events import EvalResult, RunStart, StepMetrics
from plugins.protocol.hooks import Plugin

CURVE_FILE = "loss_curve.png"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _is_rank_zero() -> bool:
    import torch

    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _config_dict(config: Any) -> dict:
    try:
        return dataclasses.asdict(config)
    except TypeError:
        return {}


class LoggingPlugin(Plugin):
    def __init__(self, config: Any) -> None:  # the plugin's LoggingConfig
        self.config = config
        self.writers: list[Any] = []
        self.run_dir: Path | None = None
        self.curves = Curves(name="run")

    def run_start(self, start: RunStart) -> None:
        if not _is_rank_zero():
            return
        self.run_dir = Path(start.run_dir)
        self.curves.name = self.run_dir.name
        if self.config.tensorboard:
            self._open("tensorboard", lambda: TensorBoardWriter(self.run_dir))
        if self.config.wandb != "off":
            self._open("wandb", lambda: WandbWriter(
                self.run_dir, self.config.wandb, self.config.wandb_project,
                self.run_dir.name, _config_dict(start.config)))

    def _open(self, name: str, make: Any) -> None:
        try:
            writer = make()
        except Exception as error:  # noqa: BLE001 - a logger never stops a run
            _say(f"{name}: could not start ({type(error).__name__}: {error}); "
                 f"the run continues without {name}")
            return
        if getattr(writer, "note", ""):
            _say(writer.note)
        _say(f"{name}: logging to {writer.path}")
        self.writers.append(writer)

    def _write(self, method: str, *args: Any) -> None:
        for writer in list(self.writers):
            try:
                getattr(writer, method)(*args)
            except Exception as error:  # noqa: BLE001 - a logger never stops a run
                _say(f"{type(writer).__name__}: {method} failed ({type(error).__name__}: "
                     f"{error}); the run continues without it")
                self.writers.remove(writer)

    def after_step(self, metrics: StepMetrics) -> None:
        if self.run_dir is None:
            return
        self.curves.add_step(metrics.step, metrics.loss, metrics.lr, metrics.phase_name,
                             metrics.source_tokens)
        self._write("log", tagged("train", metrics), metrics.step)

    def after_eval(self, evaluation: EvalResult) -> None:
        if self.run_dir is None:
            return
        self.curves.heldout_loss.append((evaluation.step, evaluation.loss))
        self._write("log", tagged("heldout", evaluation), evaluation.step)

    def whole_run(self) -> Curves:
        """The run's curves from its metrics.jsonl, the steps before a resume included (this
        start heard only its own); what this start heard when the file cannot be read or
        lacks its last step (a command that keeps no metrics.jsonl)."""
        try:
            whole = read_run(self.run_dir)
        except UserError:
            return self.curves
        heard = self.curves.train_loss[-1][0] if self.curves.train_loss else None
        if heard is not None and (not whole.train_loss or whole.train_loss[-1][0] < heard):
            return self.curves
        whole.name = self.curves.name
        return whole

    def run_end(self, summary: dict[str, Any]) -> None:
        if self.run_dir is None:
            return
        self._write("summary", {key: value for key, value in summary.items()
                                if isinstance(value, (int, float, str))})
        self._write("close")
        self.writers = []
        curves = self.whole_run()
        if self.config.loss_curve and (curves.train_loss or curves.heldout_loss):
            try:
                path = plot_curves([curves], self.run_dir / CURVE_FILE, self.run_dir.name)
                _say(f"loss curve: {path}")
            except Exception as error:  # noqa: BLE001 - a picture never fails a run
                _say(f"loss curve: not drawn ({type(error).__name__}: {error})")

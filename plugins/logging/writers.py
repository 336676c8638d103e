"""The loggers: TensorBoard event files and a Weights & Biases run, each behind one interface.

A logger must never fail or stall training: a writer that cannot start says so in one line and
the run goes on without it; W&B falls back to offline logging into the run directory when it has
no API key or cannot connect within `ONLINE_INIT_TIMEOUT_S`, and an offline run is written by
W&B's own service (no network), ready for `wandb sync <run dir>/wandb/offline-run-*`.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

ONLINE_INIT_TIMEOUT_S = 20  # longest wait for W&B's servers before logging offline instead
FINISH_TIMEOUT_S = 60  # longest wait for W&B to finish (upload) at the end


class TensorBoardWriter:
    """Scalars into `<run dir>/tensorboard/events.out.tfevents.*` (torch's SummaryWriter)."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.path), flush_secs=30)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def summary(self, values: dict[str, Any]) -> None:
        text = "\n".join(f"    {key}: {value}" for key, value in values.items())
        self.writer.add_text("summary", text)

    def close(self) -> None:
        self.writer.close()


def wandb_api_key_found() -> bool:
    """Whether W&B could log in online: WANDB_API_KEY, or api.wandb.ai in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbWriter:
    """One W&B run per training run, online or offline into `<run dir>/wandb`."""

    def __init__(self, run_dir: Path, mode: str, project: str, name: str, config: dict) -> None:
        self.mode = "online" if mode == "online" or (mode == "auto" and wandb_api_key_found()) \
            else "offline"
        self.note = ""
        args = {"dir": str(run_dir), "project": project, "name": name, "config": config}
        try:
            self.run = self._init(self.mode, args)
        except Exception as error:  # noqa: BLE001 - any failure online means: go offline
            if self.mode == "offline":
                raise
            self.note = f"wandb: online logging failed ({_first_line(error)}); logging offline"
            self.mode = "offline"
            self.run = self._init("offline", args)
        self.path = Path(self.run.dir).parent  # <run dir>/wandb/<offline->run-<date>-<id>

    @staticmethod
    def _init(mode: str, args: dict) -> Any:
        import wandb

        settings = wandb.Settings(
            silent=True, console="off", x_disable_stats=True, disable_git=True,
            save_code=False, init_timeout=ONLINE_INIT_TIMEOUT_S,
            finish_timeout=FINISH_TIMEOUT_S,
        )
        return wandb.init(mode=mode, settings=settings, reinit="create_new", **args)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def close(self) -> None:
        self.run.finish()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__

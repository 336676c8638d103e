"""Config of the logging plugin (torch-free): which loggers a run writes besides metrics.jsonl.

A plugin rather than trainer code: loggers are optional, bring packages of their own (wandb is
an extra) and need nothing but the hooks' figures. `wandb=auto` logs online when an API key is
found and offline into the run directory otherwise; no logger ever fails or stalls a run
(`plugins/logging/plugin.py`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from plugins.protocol.hooks import Plugin, PluginConfig


@dataclass(kw_only=True)
class LoggingConfig(PluginConfig):
    """TensorBoard event files, a Weights & Biases run and a loss-curve PNG, from rank 0."""

    tensorboard: bool = False  # event files in <run dir>/tensorboard
    # off; auto: online with an API key (WANDB_API_KEY or ~/.netrc), else offline; offline: into
    # <run dir>/wandb (sync later with `wandb sync`); online: online, offline if it cannot connect
    wandb: Literal["off", "auto", "offline", "online"] = "off"
    wandb_project: str = "mcore-recipes"  # W&B project of online runs
    loss_curve: bool = True  # <run dir>/loss_curve.png at the end: train and held-out loss, lr

    def active(self, cfg: Any) -> bool:
        return self.tensorboard or self.wandb != "off" or self.loss_curve

    def build(self) -> Plugin | None:
        from plugins.logging.plugin import LoggingPlugin

        return LoggingPlugin(self)

    def machine_problem(self, cfg: Any, machine: Any, on_cpu: bool) -> str | None:
        if self.wandb != "off" and importlib.util.find_spec("wandb") is None:
            return (f"plugins.logging.wandb={self.wandb} needs the wandb package, which is not "
                    "installed; install it with `pip install -e '.[wandb]'` or set "
                    "plugins.logging.wandb=off")
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            return ("plugins.logging.tensorboard=true needs the tensorboard package, which is not "
                    "installed; install it with `pip install tensorboard` or set "
                    "plugins.logging.tensorboard=false")
        return None

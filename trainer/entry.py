"""What each rank runs: runtime plugin, process groups, session, training, summary.

Errors a user can fix (`ConfigError`) and non-finite training values end the rank with one
line and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

from recipes.errors import ConfigError
from recipes.schema import RunConfig

EXIT_CONFIG_ERROR = 2
EXIT_NONFINITE = 3


def quiet_library_noise() -> None:
    """Library import warnings, repeated by every rank, would bury the run's own output.

    Call before Megatron is imported: most of these fire at import time.
    """
    warnings.filterwarnings("ignore", module=r"megatron\..*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("megatron", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)


def init_distributed(cfg: RunConfig) -> bool:
    """Start the default process group; returns whether the CPU runtime is active."""
    import torch

    from plugins.cpu_runtime import activate_cpu_runtime

    cpu = activate_cpu_runtime(cfg.plugins.cpu_runtime)
    if not cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="gloo" if cpu else "nccl", timeout=timedelta(minutes=10)
        )
    return cpu


def start_session(cfg: RunConfig, run_dir: Path):
    """Process groups, plugins and the training session for this rank."""
    from plugins.attach import attach_plugins
    from trainer.loop import build_session
    from trainer.mcore_translation import initialize_parallel_state

    cpu = init_distributed(cfg)
    initialize_parallel_state(cfg)
    hooks = attach_plugins(cfg, cpu_runtime_active=cpu)
    return build_session(cfg, run_dir, hooks, cpu_initialization=cpu)


def run_rank(cfg: RunConfig, run_dir: Path) -> dict:
    """Train on this rank; returns the run's summary figures (identical on every rank)."""
    import torch

    from trainer.loop import run_training
    from trainer.metrics import RunReporter
    from trainer.summary import build_summary, print_summary

    session = start_session(cfg, run_dir)
    reporter = RunReporter(
        run_dir, cfg.train.train_iters, cfg.logging.log_interval, cfg.logging.progress_bar
    )
    with reporter:
        history = run_training(session, reporter)
    summary = build_summary(session, history)
    session.hooks.notify_run_end(summary)
    if torch.distributed.get_rank() == 0:
        print_summary(summary, reporter.console)
        reporter.record("summary", summary)
    return summary


def main_for_rank(cfg: RunConfig, run_dir: Path) -> int:
    """Process exit code for one rank; one-line errors for user-fixable problems."""
    from trainer.loop import NonFiniteError

    try:
        run_rank(cfg, run_dir)
    except ConfigError as error:
        _print_once(f"error: {error}")
        return EXIT_CONFIG_ERROR
    except NonFiniteError as error:
        _print_once(f"error: {error}")
        return EXIT_NONFINITE
    finally:
        _shutdown()
    return 0


def _print_once(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


def _shutdown() -> None:
    import torch
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

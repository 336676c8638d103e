"""The scripts' commands: what one rank of each does once the entry pipeline hands it a config.

Each `Command` pairs a script with its rank function and its own options; `scripts/*.py` are
one line each around `trainer.entry.pipeline.main(COMMAND)`. Heavy imports stay inside the rank
functions, so `--help` and every refusal stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.schema import RunConfig
from trainer.entry.pipeline import Command, Option

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def pretrain_rank(cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> int:
    """Train on this rank, then print and record the summary (rank 0)."""
    import torch

    from trainer.loop import run_training
    from trainer.metrics import RunReporter
    from trainer.session import start_session
    from trainer.summary import build_summary, print_summary

    session = start_session(cfg, run_dir)
    log = cfg.logging
    reporter = RunReporter(run_dir, cfg.train.train_iters, log.log_interval, log.progress_bar)
    with reporter:
        history = run_training(session, reporter)
    summary = build_summary(session, history)
    session.plugins.run_end(summary)
    if torch.distributed.get_rank() == 0:
        print_summary(summary, reporter.console)
        reporter.record("summary", summary)
    return 0


def bench_step_rank(cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> int:
    """Alternate our step and a bare Megatron Core step; rank 0 prints medians and ratio."""
    import torch

    from trainer.session import start_session
    from trainer.tools.bench_step import compare_step_times

    session = start_session(cfg, run_dir)
    figures = compare_step_times(session, options["steps"], options["warmup"])
    if torch.distributed.get_rank() == 0:
        print(
            f"bench {cfg.name}: ours {figures['ours_s'] * 1e3:.1f} ms/step, bare Megatron Core "
            f"{figures['bare_s'] * 1e3:.1f} ms/step, ratio {figures['ratio']:.3f} "
            f"(median of {figures['steps']} after {figures['warmup']} warm-up)"
        )
        print(json.dumps(figures))
    return 0


def check_resume_options(options: dict[str, int]) -> None:
    if options["save_at"] >= options["steps"]:
        raise ConfigError(f"save_at={options['save_at']} must be below steps={options['steps']}, "
                          f"e.g. steps={options['save_at'] + 3}")


def validate_resume_rank(cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> int:
    """Continuous vs resumed on every rank; rank 0 prints the table. Exit 1 on any failure."""
    import torch

    from trainer.tools.resume_check import format_table, run_resume_check

    rows = run_resume_check(cfg, run_dir, options)
    if torch.distributed.get_rank() == 0:
        print(format_table(cfg.name, rows, options), flush=True)
    return 0 if all(ok for *_, ok in rows) else 1


def _script_help(name: str) -> str:
    """A script's own docstring is its usage text (read without importing the script)."""
    import ast

    return ast.get_docstring(ast.parse((SCRIPTS / name).read_text(encoding="utf-8"))) or ""


PRETRAIN = Command(
    script=SCRIPTS / "pretrain.py",
    help=_script_help("pretrain.py"),
    run_rank=pretrain_rank,
)

BENCH_STEP = Command(
    script=SCRIPTS / "bench_step.py",
    help=_script_help("bench_step.py"),
    run_rank=bench_step_rank,
    options={
        "steps": Option(default=20, help="measured rounds of each step"),
        "warmup": Option(default=3, help="rounds discarded first"),
    },
)

VALIDATE_RESUME = Command(
    script=SCRIPTS / "validate_resume.py",
    help=_script_help("validate_resume.py"),
    run_rank=validate_resume_rank,
    options={
        "steps": Option(default=6, help="steps of each run"),
        "save_at": Option(default=3, help="the step after which the checkpoint is saved"),
    },
    check_options=check_resume_options,
)

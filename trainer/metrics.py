"""Step metrics: loss reduction across ranks, log lines, progress bar, metrics.jsonl, summary.

Effective tokens/s counts each loss token of the global batch once: tokens on different DP
ranks (and CP chunks) add up; TP/PP ranks that work on the same tokens do not add again.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from plugins.protocol import EvalResult, StepMetrics
from trainer.device import compute_device


def reduce_loss_over_world(loss_reports: list[dict]) -> tuple[float, int]:
    """(mean loss per token, loss tokens) of the global batch, known on every rank.

    Only last-stage ranks hold losses; the TP-rank-0 of each DP x CP replica contributes, so a
    token is counted once however many TP/PP ranks computed it.
    """
    total = torch.zeros(2, dtype=torch.float64, device=compute_device())
    contributes = (
        parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        and parallel_state.get_tensor_model_parallel_rank() == 0
    )
    if contributes:
        for report in loss_reports:
            total += report["lm loss"].detach().to(torch.float64)
    torch.distributed.all_reduce(total)
    tokens = int(total[1].item())
    return (total[0].item() / max(tokens, 1)), tokens


def make_console() -> Console:
    """Rich console that keeps log lines whole and tables readable when piped (not 80 cols)."""
    width = None if sys.stdout.isatty() else 120
    return Console(highlight=False, soft_wrap=True, width=width)


class RunReporter:
    """Rank-0 output of a run: log lines, a progress bar and a JSONL metrics file."""

    def __init__(self, run_dir: Path, total_steps: int, log_interval: int, progress_bar: bool):
        self.enabled = torch.distributed.get_rank() == 0
        # Log lines stay whole when output goes to a file or pipe (rich would wrap at 80).
        self.console = make_console()
        self.log_interval = max(1, log_interval)
        self.metrics_path = run_dir / "metrics.jsonl"
        self.progress = None
        if self.enabled and progress_bar:
            self.progress = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.task = self.progress.add_task("train", total=total_steps, status="")

    def __enter__(self) -> RunReporter:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, markup=False)

    def record(self, kind: str, values: dict) -> None:
        if self.enabled:
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps({"kind": kind, **values}) + "\n")

    def step(self, metrics: StepMetrics, total_steps: int) -> None:
        if not self.enabled:
            return
        self.record("train", {**asdict(metrics), "tokens_per_s": metrics.tokens_per_s})
        if self.progress is not None:
            status = f"loss {metrics.loss:.4f}  {metrics.tokens_per_s:,.0f} tok/s"
            self.progress.update(self.task, completed=metrics.step, status=status)
        if metrics.step % self.log_interval == 0 or metrics.step == total_steps:
            # Plugins' figures (`StepMetrics.extra`) follow the core ones; the record has them all.
            extra = "".join(f" | {name} {value:.4g}" for name, value in metrics.extra.items())
            self.print(
                f"step {metrics.step:>5}/{total_steps} | loss {metrics.loss:.4f} | "
                f"lr {metrics.lr:.3e} | grad norm {metrics.grad_norm:.3f} | "
                f"{metrics.tokens_per_s:,.0f} tok/s | {metrics.step_time_s:.3f} s/step{extra}"
            )

    def heldout(self, evaluation: EvalResult) -> None:
        self.record("heldout", {"step": evaluation.step, "loss": evaluation.loss})
        self.print(f"held-out loss at step {evaluation.step}: {evaluation.loss:.4f}")

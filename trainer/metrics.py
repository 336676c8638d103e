"""Step metrics: loss reduction across ranks, log lines, progress bar, metrics.jsonl, summary.

Effective tokens/s counts each loss token of the global batch once: tokens on different DP
ranks (and CP chunks) add up; TP/PP ranks that work on the same tokens do not add again
(definitions in `trainer/throughput.py`). The log line adds model TFLOP/s per GPU, MFU when
the run names a peak, and where the step's time went.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from plugins.protocol.events import EvalResult, StepMetrics
from trainer.device import compute_device
from trainer.throughput import counts_loss_tokens, counts_trained_rows


def reduce_loss_over_world(loss_reports: list[dict]) -> tuple[float, int]:
    """(mean loss per token, loss tokens) of the global batch, known on every rank."""
    totals = reduce_step_over_world(loss_reports, [])
    return totals.loss, totals.loss_tokens


class StepTotals(NamedTuple):
    """A step's figures summed over the world, known on every rank."""

    loss: float  # mean loss per loss token of the global batch
    loss_tokens: int
    phase_seconds: list[float]  # each phase's mean seconds over ranks
    trained_tokens: int  # tokens of the sequences trained (`trainer.throughput.trained_sequences`)
    squared_lengths: int  # the sum of those sequences' squared lengths
    flags: tuple[float, ...] = ()  # each rank's `flags`, summed (the stop signals noted)


def reduce_step_over_world(
    loss_reports: list[dict], phase_seconds: list[float], sequences: tuple[int, int] = (0, 0),
    flags: tuple[float, ...] = (),
) -> StepTotals:
    """The step's loss, loss tokens, phase times, trained sequences and `flags` (summed), on
    every rank.

    Only last-stage ranks hold losses; the TP-rank-0 of each DP x CP replica contributes, so a
    token is counted once however many TP/PP ranks computed it (`counts_loss_tokens`). This
    rank's `sequences` ((tokens, squared lengths) of the rows it took) count once per DP
    replica (`counts_trained_rows`). The phase times, the sequences and the flags ride on the
    same all-reduce: they cost no extra collective.
    """
    total = torch.zeros(4 + len(phase_seconds) + len(flags), dtype=torch.float64,
                        device=compute_device())
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if counts_loss_tokens(tp_rank, last_stage):
        for report in loss_reports:
            total[:2] += report["lm loss"].detach().to(torch.float64)
    host = list(phase_seconds) + list(flags)
    if counts_trained_rows(tp_rank, parallel_state.get_context_parallel_rank(), last_stage):
        host += [float(n) for n in sequences]  # exact in float64 below 2**53
    else:
        host += [0.0, 0.0]
    # Host figures travel in one copy (no device read-back); the losses stay on the device.
    total[2:] = torch.tensor(host, dtype=torch.float64)
    torch.distributed.all_reduce(total)
    values = total.tolist()
    tokens = int(values[1])
    ranks = torch.distributed.get_world_size()
    phases = [value / ranks for value in values[2:2 + len(phase_seconds)]]
    summed = tuple(values[2 + len(phase_seconds):2 + len(phase_seconds) + len(flags)])
    return StepTotals(values[0] / max(tokens, 1), tokens, phases, int(values[-2]),
                      int(values[-1]), summed)


def max_over_world(values: list[float]) -> list[float]:
    """The largest of every rank's value, element by element (the slowest rank sets what a
    step waits for)."""
    figures = torch.tensor(values, dtype=torch.float64, device=compute_device())
    torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)
    return figures.tolist()


def format_speed(metrics: StepMetrics) -> str:
    """Model TFLOP/s per GPU, MFU where the run knows its peak (left out otherwise: a CPU run
    or one without `cluster.spec` has no peak to divide by), and the busiest rank's peak memory
    where the step measured it."""
    text = f"{metrics.model_tflops_per_gpu:.3g} TFLOP/s/GPU"
    if metrics.mfu is not None:
        text += f" | MFU {metrics.mfu:.1%}"
    if metrics.memory_gib is not None:
        text += f" | peak mem {metrics.memory_gib:.2f} GiB"
        if metrics.memory_reserved_gib is not None:
            text += f" ({metrics.memory_reserved_gib:.2f} reserved)"
    return text


def format_breakdown(metrics: StepMetrics) -> str:
    """Shares of the step: data wait, forward-backward, optimizer (+ exposed comm, profiled)."""
    total = metrics.step_time_s or 1.0
    text = (f"data {metrics.data_wait_s / total:.0%} fwd-bwd "
            f"{metrics.forward_backward_s / total:.0%} opt {metrics.optimizer_s / total:.0%}")
    if metrics.exposed_comm_s is not None:
        text += f" comm exposed {metrics.exposed_comm_s / total:.0%} (profiled)"
    return text


def make_console() -> Console:
    """Rich console that keeps log lines whole and tables readable when piped (not 80 cols)."""
    width = None if sys.stdout.isatty() else 120
    return Console(highlight=False, soft_wrap=True, width=width)


def _recorded_before(record: dict, step: int) -> bool:
    """Whether an earlier attempt's record stands when a run continues from `step`."""
    at = record.get("step")
    if at is None:
        return False
    return at <= step if record.get("kind") == "train" else at < step


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

    def continue_from(self, step: int) -> None:
        """A start at `step` (a resume, a requeued attempt, or step 0 again after an attempt that
        never saved): drop what an earlier attempt recorded past it, so every step is in
        `metrics.jsonl` once. Kept: train records up to `step` (those steps are in the
        checkpoint), held-out records before it (the start evaluates `step` again); a summary
        belongs to the attempt that wrote it and goes too. Written beside, then renamed."""
        if not self.enabled or not self.metrics_path.exists():
            return
        kept = [line for line in self.metrics_path.read_text().splitlines()
                if line.strip() and _recorded_before(json.loads(line), step)]
        fresh = self.metrics_path.with_name(f"{self.metrics_path.name}.tmp-{os.getpid()}")
        fresh.write_text("".join(f"{line}\n" for line in kept))
        os.replace(fresh, self.metrics_path)

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
            # Plugins' figures (`StepMetrics.extra`) follow the core ones, then speed and the
            # step's breakdown; the record has them all.
            extra = "".join(f" | {name} {value:.4g}" for name, value in metrics.extra.items())
            self.print(
                f"step {metrics.step:>5}/{total_steps} | loss {metrics.loss:.4f} | "
                f"lr {metrics.lr:.3e} | grad norm {metrics.grad_norm:.3f} | "
                f"{metrics.tokens_per_s:,.0f} tok/s | {metrics.step_time_s:.3f} s/step{extra} | "
                f"{format_speed(metrics)} | {format_breakdown(metrics)}"
            )

    def heldout(self, evaluation: EvalResult) -> None:
        self.record("heldout", {"step": evaluation.step, "loss": evaluation.loss})
        self.print(f"held-out loss at step {evaluation.step}: {evaluation.loss:.4f}")

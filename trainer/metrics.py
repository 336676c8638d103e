"""Step metrics: sums across ranks, log lines, progress bar, metrics.jsonl, summary.

Effective tokens/s counts each loss token of the global batch once: tokens on different DP
ranks (and CP chunks) add up; TP/PP ranks that work on the same tokens do not add again
(definitions in `trainer/throughput.py`); a step's own figure (`StepMetrics.tokens_per_s`, in
the log line and the train record) is that definition over a one-step window. The log line adds
model TFLOP/s per GPU, MFU with the peak it divides by when the run names one, and where the
step's time went.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from plugins.protocol.events import EvalResult, StepMetrics
from plugins.protocol.metrics_file import record_lines
from trainer.device import compute_device
from trainer.run_dir import METRICS_FILE
from trainer.step_clock import RunPeak
from trainer.throughput import counts_loss_tokens, counts_trained_rows


def local_loss_sums(loss_reports: list[dict], mtp_depths: int = 0) -> torch.Tensor:
    """This rank's part of a step's loss sums, kept on the device: [LM loss sum, loss tokens],
    then [sum, tokens] of each MTP depth, float64 (zeros on ranks that do not count them).

    Only last-stage ranks hold losses; the TP-rank-0 of each DP x CP replica contributes, so a
    token is counted once however many TP/PP ranks computed it (`counts_loss_tokens`). Device
    operations only: nothing here waits for the device.
    """
    sums = torch.zeros(2 + 2 * mtp_depths, dtype=torch.float64, device=compute_device())
    last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if counts_loss_tokens(parallel_state.get_tensor_model_parallel_rank(), last_stage):
        for report in loss_reports:
            sums[:2] += report["lm loss"].detach().to(sums.device, torch.float64)
            if mtp_depths and "mtp loss" in report:
                sums[2:] += report["mtp loss"].to(sums.device, torch.float64)
    return sums


def counted_sequences(sequences: tuple[int, int]) -> tuple[int, int]:
    """This rank's `sequences` ((tokens, squared lengths) of the rows it took) where its DP
    replica reports them (`counts_trained_rows`: once per replica), else (0, 0)."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if counts_trained_rows(tp_rank, parallel_state.get_context_parallel_rank(), last_stage):
        return sequences
    return (0, 0)


def sum_over_world(device_rows: torch.Tensor, host_rows: list[list[float]]) -> list[list[float]]:
    """Row by row, each rank's `device_rows` (kept on the device) beside its `host_rows` (one
    copy to the device), summed over every rank in one all-reduce; the sums on every rank.
    Float64 holds counts exactly below 2**53."""
    host = torch.tensor(host_rows, dtype=torch.float64).reshape(len(host_rows), -1)
    total = torch.cat([device_rows.to(torch.float64), host.to(device_rows.device)], dim=1)
    torch.distributed.all_reduce(total)
    return total.tolist()


def reduce_loss_over_world(loss_reports: list[dict]) -> tuple[float, int]:
    """(mean loss per token, loss tokens) of the global batch, known on every rank."""
    loss_sum, tokens = sum_over_world(local_loss_sums(loss_reports)[None], [[]])[0]
    return loss_sum / max(tokens, 1.0), int(tokens)


class LaterWorldSum:
    """A sum over every rank started now and read later, so no rank waits for the others
    where it is started: on CPU ranks gloo adds in its own thread; on GPUs NCCL adds on its
    stream and a side stream copies the result to pinned host memory behind an event, so
    neither the start nor the read waits for the step's kernels. Read after work that every
    rank does with the others (an optimizer step), every rank has given its part and the read
    waits for nothing. Every rank must start the same sums in the same order (as every
    collective)."""

    def __init__(self, values: tuple[float, ...]):
        host = torch.tensor(values, dtype=torch.float64)
        self.event = None
        if not torch.cuda.is_available():
            self.tensor = host
            self.work = torch.distributed.all_reduce(self.tensor, async_op=True)
            return
        self.tensor = host.pin_memory().to(compute_device(), non_blocking=True)
        self.work = torch.distributed.all_reduce(self.tensor, async_op=True)
        with torch.cuda.stream(_side_stream()):
            self.work.wait()  # this stream waits for the sum; the host does not
            self.host = torch.empty(host.shape, dtype=torch.float64, pin_memory=True)
            self.host.copy_(self.tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def result(self) -> tuple[float, ...]:
        if self.event is not None:
            self.event.synchronize()
            return tuple(self.host.tolist())
        self.work.wait()
        return tuple(self.tensor.tolist())


@functools.cache
def _side_stream():
    """The stream `LaterWorldSum` copies its results on (one per process)."""
    return torch.cuda.Stream()


def max_over_world(values: list[float]) -> list[float]:
    """The largest of every rank's value, element by element (the slowest rank sets what a
    step waits for)."""
    figures = torch.tensor(values, dtype=torch.float64, device=compute_device())
    torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)
    return figures.tolist()


def format_speed(metrics: StepMetrics, peak: RunPeak | None = None) -> str:
    """Model TFLOP/s per GPU, MFU where the run knows its peak (left out otherwise: a CPU run
    or one without `cluster.spec` has no peak to divide by) with the precision of that peak,
    and the busiest rank's peak memory where the step measured it."""
    text = f"{metrics.model_tflops_per_gpu:.3g} TFLOP/s/GPU"
    if metrics.mfu is not None:
        text += f" | MFU {metrics.mfu:.1%}"
        if peak is not None and peak.tflops is not None:
            text += f" of {peak.precision} peak"
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

    def __init__(self, run_dir: Path, total_steps: int, log_interval: int, progress_bar: bool,
                 peak: RunPeak | None = None):
        self.enabled = torch.distributed.get_rank() == 0
        self.peak = peak  # what MFU divides by, named in records and log lines (one per run)
        # Log lines stay whole when output goes to a file or pipe (rich would wrap at 80).
        self.console = make_console()
        self.log_interval = max(1, log_interval)
        self.metrics_path = run_dir / METRICS_FILE
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
        # A last line cut short by a killed rank is dropped; damage before it was refused
        # before launch (`run_dir.metrics_problem`).
        lines, _ = record_lines(self.metrics_path, self.metrics_path.read_bytes(),
                                "move the file aside and run again")
        kept = [raw for raw, record in lines if _recorded_before(record, step)]
        fresh = self.metrics_path.with_name(f"{self.metrics_path.name}.tmp-{os.getpid()}")
        fresh.write_bytes(b"".join(raw + b"\n" for raw in kept))
        os.replace(fresh, self.metrics_path)

    def record(self, kind: str, values: dict) -> None:
        if not self.enabled:
            return
        try:
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps({"kind": kind, **values}) + "\n")
        except OSError as error:  # a write names no file: a full disk's line names this one
            raise OSError(error.errno, error.strerror, str(self.metrics_path)) from None

    def reached(self, step: int) -> None:
        """The bar moves with every step; its loss and tokens/s follow when a step's figures
        are summed (`step`)."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def step(self, metrics: StepMetrics, total_steps: int) -> None:
        """Record the step (with the peak its MFU divides by: `peak_tflops` of
        `peak_precision`, where the run has one), and show it at the log interval."""
        if not self.enabled:
            return
        peak = self.peak
        rate = metrics.tokens_per_s
        divided_by = {} if peak is None or peak.tflops is None else {
            "peak_tflops": peak.tflops, "peak_precision": peak.precision}
        self.record("train", {**asdict(metrics), "tokens_per_s": rate, **divided_by})
        if self.progress is not None:
            status = f"loss {metrics.loss:.4f}  {rate:,.0f} tok/s"
            self.progress.update(self.task, status=status)
        if metrics.step % self.log_interval == 0 or metrics.step == total_steps:
            # Plugins' figures (`StepMetrics.extra`) follow the core ones, then speed and the
            # step's breakdown; the record has them all.
            extra = "".join(f" | {name} {value:.4g}" for name, value in metrics.extra.items())
            self.print(
                f"step {metrics.step:>5}/{total_steps} | loss {metrics.loss:.4f} | "
                f"lr {metrics.lr:.3e} | grad norm {metrics.grad_norm:.3f} | "
                f"{rate:,.0f} tok/s | {metrics.step_time_s:.3f} s/step{extra} | "
                f"{format_speed(metrics, peak)} | {format_breakdown(metrics)}"
            )

    def heldout(self, evaluation: EvalResult) -> None:
        self.record("heldout", {"step": evaluation.step, "loss": evaluation.loss})
        self.print(f"held-out loss at step {evaluation.step}: {evaluation.loss:.4f}")

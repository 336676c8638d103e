"""The one-screen end-of-run summary: layout, parameters, tokens, speed, loss, outputs.

Speed is stated as the scaling harness reads it: effective tokens/s over whole measured steps,
model TFLOP/s per GPU and MFU (unknown without a peak, and the summary says why), with the
batch, sequence length and precision that make two runs comparable (`trainer/throughput.py`).
The figures are this launch's: a resumed run's summary covers the steps from its resume on and
says so (`covers`); the run's earlier steps are in metrics.jsonl's train records. Two token
counts, each with one name: tokens seen (samples x sequence length, padding included) and loss
tokens (the tokens that carry loss, which tokens/s counts).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.table import Table

from recipes.config.phases import phase_spans, run_samples_at
from recipes.plan.flops import model_flops_utilisation, tflops_per_gpu
from trainer.device import compute_device
from trainer.model import distinct_parameter_counts
from trainer.state import RunHistory
from trainer.step_clock import run_peak
from trainer.throughput import is_measured, measured_throughput


def describe_run_layout(cfg) -> str:
    """The layout with sequence parallelism marked and the rank count, for reports."""
    layout = cfg.layout
    return f"{layout.describe(show_sequence_parallel=True)} ({layout.world_size} ranks)"


def model_parameter_count(model: list) -> int:
    """Parameters of one whole model, summed over the ranks that hold distinct pieces.

    Dense weights are replicated over DP x CP and expert weights over the expert-DP group;
    each rank adds its share so every weight is counted once.
    """
    dense, expert = distinct_parameter_counts(
        model, parallel_state.get_tensor_model_parallel_rank()
    )
    dense_replicas = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    expert_replicas = parallel_state.get_expert_data_parallel_world_size()
    share = dense / dense_replicas + expert / expert_replicas
    total = torch.tensor([share], dtype=torch.float64, device=compute_device())
    torch.distributed.all_reduce(total)
    return round(total.item())


def speed_summary(cfg, history: RunHistory) -> dict:
    """Effective tokens/s over the measured steps (whole steps after warm-up, outside the
    profiler window: sum of tokens over sum of seconds), model TFLOP/s per GPU over the same
    steps (the useful FLOPs each of them trained, packed documents as they came, over their
    seconds) and MFU against the peak it names (`peak_tflops` of `peak_precision`; None
    without one, `mfu_unknown` saying why)."""
    steps = history.step_times
    profiling = cfg.logging.exposed_comm
    kept = [index for index in range(len(steps))
            if is_measured(index, len(steps), exposed_comm=profiling)]
    measured = len(kept)
    kept = kept or list(range(len(steps)))
    seconds = sum(steps[index][0] for index in kept)
    world = cfg.layout.world_size
    tflops = tflops_per_gpu(sum(history.step_flops[index] for index in kept), seconds, world)
    peak = run_peak(cfg)
    return {
        "effective_tokens_per_s": (measured_throughput(steps, exposed_comm=profiling)
                                   if steps else 0.0),
        "measured_steps": measured,
        "model_tflops_per_gpu": tflops,
        "peak_tflops": peak.tflops,
        "peak_precision": peak.precision,
        "mfu": model_flops_utilisation(tflops, peak.tflops),
        "mfu_unknown": peak.unknown,
    }


def covered_steps(start_step: int, last_step: int, train_iters: int) -> str:
    """Which of the run's steps a launch's summary covers, in words: all of them, or this
    launch's (after a resume, or up to where a later phase starts a new launch)."""
    resumed = f"resumed from step {start_step}" if start_step else ""
    if last_step <= start_step:
        return f"none (this launch; {resumed})" if resumed else "none"
    steps = f"steps {start_step + 1}-{last_step} of {train_iters}"
    if not resumed and last_step == train_iters:
        return steps
    return f"{steps} (this launch{'; ' + resumed if resumed else ''})"


def phase_rows(cfg, start_step: int = 0, end_step: int | None = None) -> list[dict]:
    """One row per phase: its steps, tokens (as the batch ramp-up takes them), blend, batch
    and sequence length; tokens count the steps this session trained (`start_step` to
    `end_step`), so a phase a resume skipped or a later launch trains shows none."""
    rows, end_step = [], cfg.train.train_iters if end_step is None else end_step
    for span in phase_spans(cfg):
        last = min(span.end_step, end_step)
        first = min(max(span.start_step, start_step), last)
        samples = run_samples_at(cfg, last) - run_samples_at(cfg, first)
        rows.append({"phase": span.name, "steps": f"{span.start_step}-{span.end_step}",
                     "tokens": samples * span.seq_length,
                     "blend": span.blend or cfg.data.source,
                     "global_batch": (f"ramp to {span.global_batch_size}"
                                      if cfg.train.rampup_batch_size else span.global_batch_size),
                     "seq_length": span.seq_length,
                     "lr": "decays" if span.lr_decay else ""})
    return rows


def build_summary(session, history: RunHistory) -> dict:
    """The summary of this launch's steps (`covers`: which; `resumed_from`: the step a resume
    started at, None for a fresh run)."""
    cfg, start, last = session.cfg, session.start_step, session.state.step
    heldout = history.heldout
    phases = phase_rows(cfg, start, last)
    return {
        "recipe": cfg.name,
        "layout": describe_run_layout(cfg),
        "backend": "CPU (gloo)" if not torch.cuda.is_available() else "GPU (nccl)",
        "parameters": model_parameter_count(session.model),
        "steps": last - start,
        "first_step": start + 1 if last > start else None,
        "last_step": last,
        "resumed_from": start or None,
        "covers": covered_steps(start, last, cfg.train.train_iters),
        "tokens_seen": sum(row["tokens"] for row in phases),
        "loss_tokens": sum(tokens for _, tokens in history.step_times),
        "global_batch_size": cfg.train.global_batch_size,
        "seq_length": cfg.model.seq_length,
        "precision": cfg.precision.dtype,
        "skipped_steps": session.state.skipped_steps,  # fp16 overflows, the run so far
        **speed_summary(cfg, history),
        "first_train_loss": history.first_loss,
        "final_train_loss": history.final_loss,
        "heldout_loss_start": heldout[0][1] if heldout else None,
        "heldout_loss_end": heldout[-1][1] if heldout else None,
        "run_dir": str(session.run_dir),
        "checkpoint": history.checkpoint,
        "phases": phases,
        "source_tokens": dict(session.train_batches.source_tokens),
    }


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_summary(summary: dict, console: Console) -> None:
    table = Table(title=f"run summary: {summary['recipe']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    labels = {
        "layout": "layout", "backend": "backend", "parameters": "parameters",
        "covers": "steps covered", "steps": "optimizer steps",
        "tokens_seen": "tokens seen (samples x seq length, with padding)",
        "loss_tokens": "loss tokens (what tokens/s counts)",
        "effective_tokens_per_s": "effective tokens/s (measured steps)",
        "model_tflops_per_gpu": "model TFLOP/s per GPU", "mfu": "MFU",
        "first_train_loss": "train loss, first step covered",
        "final_train_loss": "train loss, last step",
        "heldout_loss_start": "held-out loss, start", "heldout_loss_end": "held-out loss, end",
        "run_dir": "run directory", "checkpoint": "checkpoint",
    }
    for key, label in labels.items():
        if key not in summary:  # a summary written before the key existed
            continue
        table.add_row(label, mfu_row(summary) if key == "mfu" else _fmt(summary[key]))
        if key == "steps" and summary.get("skipped_steps"):
            table.add_row("updates skipped (fp16 overflow)", skipped_row(summary))
    total = sum(summary["source_tokens"].values())
    if len(summary["source_tokens"]) > 1:
        shares = ", ".join(f"{name} {tokens / total:.1%}"
                           for name, tokens in summary["source_tokens"].items())
        table.add_row("tokens seen per source (the run so far)", shares)
    console.print(table)
    if len(summary["phases"]) > 1:
        print_phases(summary["phases"], console)


def mfu_row(summary: dict) -> str:
    """MFU with the peak it divides by, or why it is unknown."""
    if summary["mfu"] is None:
        return f"- ({summary.get('mfu_unknown') or 'no peak named'})"
    return (f"{summary['mfu']:.1%} of the {summary['peak_precision']} peak, "
            f"{summary['peak_tflops']:g} TFLOP/s per GPU")


def skipped_row(summary: dict) -> str:
    """The steps whose update fp16's loss scaler skipped: the run's count (a resumed run's
    includes those before the resume, as its saved state counts them)."""
    return f"{summary['skipped_steps']:,} (the run so far; their lr did not advance)"


def print_phases(rows: list[dict], console: Console) -> None:
    """The run's phases, one row each."""
    table = Table(title="phases")
    for column in rows[0]:
        table.add_column("tokens seen" if column == "tokens" else column.replace("_", " "))
    for row in rows:
        table.add_row(*(_fmt(value) for value in row.values()))
    console.print(table)

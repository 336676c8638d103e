"""The one-screen end-of-run summary: layout, parameters, tokens, speed, loss, outputs."""

from __future__ import annotations

import statistics

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.table import Table

from trainer.device import compute_device
from trainer.model import distinct_parameter_counts
from trainer.state import RunHistory


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


def build_summary(session, history: RunHistory) -> dict:
    cfg = session.cfg
    times = history.step_times[1:] or history.step_times  # first step warms up
    tokens_per_s = statistics.median(tok / t for t, tok in times) if times else 0.0
    steps_run = cfg.train.train_iters - session.start_step
    heldout = history.heldout
    return {
        "recipe": cfg.name,
        "layout": describe_run_layout(cfg),
        "backend": "CPU (gloo)" if not torch.cuda.is_available() else "GPU (nccl)",
        "parameters": model_parameter_count(session.model),
        "steps": steps_run,
        "tokens_seen": steps_run * cfg.train.global_batch_size * cfg.model.seq_length,
        "loss_tokens_per_s": tokens_per_s,
        "first_train_loss": history.first_loss,
        "final_train_loss": history.final_loss,
        "heldout_loss_start": heldout[0][1] if heldout else None,
        "heldout_loss_end": heldout[-1][1] if heldout else None,
        "run_dir": str(session.run_dir),
        "checkpoint": history.checkpoint,
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
        "steps": "optimizer steps", "tokens_seen": "tokens seen",
        "loss_tokens_per_s": "effective tokens/s (median)",
        "first_train_loss": "train loss, first step", "final_train_loss": "train loss, last step",
        "heldout_loss_start": "held-out loss, start", "heldout_loss_end": "held-out loss, end",
        "run_dir": "run directory", "checkpoint": "checkpoint",
    }
    for key, label in labels.items():
        table.add_row(label, _fmt(summary[key]))
    console.print(table)

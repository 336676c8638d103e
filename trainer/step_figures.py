"""A step's figures: what each rank knows when its update is applied, and the world sums that
make them the step's `StepMetrics`, several steps in one reduction.

Megatron-LM keeps each step's loss on the device and reads it at the log interval; so does this
trainer. A step ends with a `StepRecord`: this rank's loss and token sums still on the device,
its phase clock not yet read, the rows it trained counted on the host. `settle_steps` sums the
records of every step since the last settling over the world in one all-reduce when the loop
needs figures (a log line, an evaluation, a checkpoint, a stop, the last step), so a step has no
collective and no read of the device beyond Megatron's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from plugins.protocol.events import StepMetrics
from recipes.config.phases import phase_config
from recipes.plan.flops import FlopsShape, model_flops_utilisation, tflops_per_gpu, training_flops
from trainer.metrics import max_over_world, sum_over_world
from trainer.step_clock import StepClock, run_peak


@dataclass
class StepRecord:
    """One optimizer step as this rank knows it right after the update."""

    step: int  # optimizer steps done, this one included
    phase: Any  # the run phase's span (`recipes/config/phases.py`) that trained it
    global_batch: int  # samples of this step
    lr: float
    grad_norm: float  # reduced by Megatron's optimizer: the same on every rank
    skipped: bool  # the optimizer did not apply the update (the same on every rank)
    clock: StepClock  # data wait, forward-backward, optimizer; read when settled
    losses: torch.Tensor  # `trainer.metrics.local_loss_sums`, on the device
    sequences: tuple[int, int]  # (tokens, squared lengths) of the rows it counts
    measured: bool  # enters the run's throughput (after warm-up, not profiled)
    profiled: dict = field(default_factory=dict)  # `trainer.step.profiled_figures`
    memory: tuple[float, ...] | None = None  # `trainer.step.memory_peaks`, on logged steps
    source_tokens: dict[str, int] = field(default_factory=dict)


def settle_steps(session, records: list[StepRecord]) -> list[StepMetrics]:
    """The `StepMetrics` of `records` (steps in order, every rank the same steps), from one sum
    over the world (loss and tokens, the losses of the MTP depths, each phase's seconds for
    their mean over ranks, the trained sequences) and one maximum (each step's time and the
    logged steps' peak memory: the slowest and the busiest rank's). Counts the loss tokens
    into the run state."""
    if not records:
        return []
    cfg = session.cfg
    depths = cfg.layout.mtp_depths  # the MTP depths whose losses a step reports
    seconds = [record.clock.seconds() for record in records]
    host = [[*phases, *map(float, record.sequences)]
            for phases, record in zip(seconds, records, strict=True)]
    summed = sum_over_world(torch.stack([record.losses for record in records]), host)
    maxima = iter(max_over_world([sum(phases) for phases in seconds] + [
        peak for record in records for peak in record.memory or ()]))
    step_times = [next(maxima) for _ in records]
    ranks = torch.distributed.get_world_size()
    peak = run_peak(cfg).tflops  # once per sum, not per step
    settled = []
    for record, step_time, values in zip(records, step_times, summed, strict=True):
        tokens = int(values[1])
        session.state.count_tokens(tokens)
        memory = [next(maxima) for _ in record.memory or ()]
        settled.append(_metrics(cfg, record, step_time, memory, values, tokens, depths, ranks,
                                peak))
    return settled


def _metrics(cfg, record: StepRecord, step_time: float, memory: list[float],
             values: list[float], tokens: int, depths: int, ranks: int,
             peak: float | None) -> StepMetrics:
    mean_phases = [value / ranks for value in values[2 + 2 * depths:2 + 2 * depths + 3]]
    mtp = {f"mtp_{d + 1}_loss": values[2 + 2 * d] / max(values[3 + 2 * d], 1.0)
           for d in range(depths)}
    # Useful FLOPs of the sequences this step trained: full rows, or each packed row's
    # documents (trainer/throughput.py), summed over the DP replicas.
    step_cfg = phase_config(cfg, dataclasses.replace(record.phase,
                                                     global_batch_size=record.global_batch))
    flops = training_flops(FlopsShape.from_config(step_cfg), int(values[-2]), int(values[-1]))
    tflops = tflops_per_gpu(flops, step_time, ranks)
    return StepMetrics(
        step=record.step,
        loss=values[0] / max(tokens, 1),
        lr=record.lr,
        grad_norm=record.grad_norm,
        loss_tokens=tokens,
        step_time_s=step_time,
        skipped=record.skipped,
        data_wait_s=mean_phases[0],
        forward_backward_s=mean_phases[1],
        optimizer_s=mean_phases[2],
        exposed_comm_s=record.profiled.get("exposed_comm_s"),
        model_flops=flops,
        model_tflops_per_gpu=tflops,
        mfu=model_flops_utilisation(tflops, peak),
        measured=record.measured,
        memory_gib=memory[0] if memory else None,
        memory_reserved_gib=memory[1] if len(memory) > 1 else None,
        stage_compute_s=record.profiled.get("stage_compute_s"),
        phase=record.phase.index,
        global_batch=record.global_batch,
        phase_name=record.phase.name,
        source_tokens=record.source_tokens,
        extra=mtp,
    )

"""One optimizer step and one held-out evaluation through Megatron's pipeline schedules.

The step is timed as a whole optimizer step with its phases (data wait, forward-backward,
optimizer) and, on profiled steps, its exposed communication; see `trainer/step_clock.py`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from plugins.protocol.events import EvalResult, StepMetrics
from plugins.protocol.hooks import PluginSet
from recipes.config.phases import phase_config
from recipes.models.hybrid.pattern import mtp_depths
from recipes.plan.flops import (
    FlopsShape,
    model_flops_utilisation,
    tflops_per_gpu,
    training_flops,
)
from trainer.data import MicroBatch
from trainer.device import compute_device, to_compute_device
from trainer.metrics import max_over_world, reduce_loss_over_world, reduce_step_over_world
from trainer.step_clock import (
    StepClock,
    peak_memory_gib,
    peak_reserved_gib,
    run_peak_tflops,
    start_profiler,
    stop_profiler,
)
from trainer.throughput import counts_loss_tokens, is_measured, trained_sequences


def masked_token_loss(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    """Summed loss over loss tokens, the token count, and a [sum, count] report for logging.

    With `calculate_per_token_loss` Megatron divides the gradient by the loss-token count of the
    whole global batch (all micro-batches, all DP x CP ranks), so padding/masked tokens never
    dilute the mean and every layout optimises the same objective.
    """
    mask = loss_mask.reshape(-1).to(per_token_loss.dtype)
    loss_sum = torch.sum(per_token_loss.float().reshape(-1) * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss_sum.detach(), num_tokens.to(torch.float32)])
    return loss_sum, num_tokens, {"lm loss": report}


def forward_kwargs(batch: MicroBatch) -> dict:
    """GPTModel.forward's arguments for a plain batch; plugins may add to them (e.g.
    `packed_seq_params` for packed sequences) through the `forward_kwargs` hook. The loss mask
    is for the MTP loss, which Megatron computes inside the model and, without it, over every
    position, padding and document ends included (`transformer/multi_token_prediction.py:
    821-822`); the LM loss applies it outside (`masked_token_loss`)."""
    return {
        "input_ids": batch["tokens"],
        "position_ids": batch["position_ids"],
        "attention_mask": batch.get("attention_mask"),
        "labels": batch["labels"],
        "loss_mask": batch["loss_mask"],
    }


def make_forward_step(plugins: PluginSet) -> Callable:
    def forward_step(data_iterator, model, return_schedule_plan: bool = False):
        batch = plugins.microbatch(to_compute_device(next(data_iterator)))
        kwargs = plugins.forward_kwargs(batch, forward_kwargs(batch))
        # EP communication overlap: Megatron's 1F1B schedule of two micro-batches asks for the
        # model's schedule plan instead of its output (`pipeline_parallel/combined_1f1b.py:384`,
        # `models/gpt/gpt_model.py:798`), as Megatron-LM's forward step gives it.
        run = model.build_schedule_plan if return_schedule_plan else model
        return run(**kwargs), partial(loss_with_mtp, batch["loss_mask"])

    return forward_step


def _data_iterators(microbatches: list[MicroBatch], num_chunks: int):
    # The interleaved schedule pulls each chunk's micro-batches from its own iterator.
    if num_chunks == 1:
        return iter(microbatches)
    return [iter(microbatches) for _ in range(num_chunks)]


def run_schedule(
    model: list, microbatches: list[MicroBatch], plugins: PluginSet, *, seq_length: int,
    micro_batch_size: int, forward_only: bool,
) -> list[dict]:
    forward_backward = get_forward_backward_func()
    return forward_backward(
        forward_step_func=make_forward_step(plugins),
        data_iterator=_data_iterators(microbatches, len(model)),
        model=model if len(model) > 1 else model[0],
        num_microbatches=len(microbatches),
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )


def _forward_backward(session, microbatches: list[MicroBatch]) -> list[dict]:
    for chunk in session.model:
        chunk.zero_grad_buffer()
    session.optimizer.zero_grad()
    return run_schedule(
        session.model,
        microbatches,
        session.plugins,
        seq_length=session.cfg.model.seq_length,
        micro_batch_size=session.cfg.train.micro_batch_size,
        forward_only=False,
    )


def mtp_loss_report() -> torch.Tensor | None:
    """This micro-batch's MTP loss on this rank, [sum, tokens] per depth, or None without MTP.

    Megatron's MTP computes each depth's per-token loss inside the model forward and records
    it, with its token count, in `MTPLossLoggingHelper.tracker` on the last stage
    (`transformer/multi_token_prediction.py:866-880`, training forwards only); the loss
    function runs right after that forward, so it reads this micro-batch's values and clears
    them. Sum and count (not the mean Megatron-LM logs) make the step's figure a per-token mean
    over the global batch, the same in every layout, as the LM loss is."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    if "loss_values" not in tracker:
        return None
    means, counts = tracker["loss_values"].detach(), tracker["total_values"].detach()
    report = torch.stack([means * counts, counts], dim=1).reshape(-1).to(torch.float64)
    MTPLossLoggingHelper.clean_metrics_in_tracker()
    return report


def loss_with_mtp(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    """`masked_token_loss`, its report joined by the micro-batch's MTP losses when the model
    has MTP depths (the training forward recorded them)."""
    loss_sum, num_tokens, report = masked_token_loss(loss_mask, per_token_loss)
    mtp = mtp_loss_report()
    if mtp is not None:
        report["mtp loss"] = mtp
    return loss_sum, num_tokens, report


def mtp_losses(cfg, loss_reports: list[dict]) -> dict[str, float]:
    """Each MTP depth's per-token loss over the step's global batch (`mtp_1_loss`, ...),
    unscaled (the LM loss adds their mean times `model.mtp_loss_scaling_factor`), on every rank:
    the last stage's TP-rank-0 ranks hold the sums (each CP chunk and DP replica its own), one
    all-reduce over the world adds them up."""
    depths = mtp_depths(cfg.model.hybrid_layer_pattern) if cfg.model.is_hybrid else 0
    if not depths:
        return {}
    totals = torch.zeros(2 * depths, dtype=torch.float64, device=compute_device())
    last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if counts_loss_tokens(parallel_state.get_tensor_model_parallel_rank(), last_stage):
        for report in loss_reports:
            if "mtp loss" in report:
                totals += report["mtp loss"].to(totals.device)
    torch.distributed.all_reduce(totals)
    values = totals.tolist()
    return {f"mtp_{d + 1}_loss": values[2 * d] / max(values[2 * d + 1], 1.0)
            for d in range(depths)}


def train_step(session, stop=None) -> StepMetrics:
    """Forward/backward over the next global batch's micro-batches, then one optimizer update;
    the session's run state advances by one step. A `stop` request (`trainer.loop.StopRequest`)
    learns on the step's own world reduction whether any rank noted a stop signal.

    On CPU ranks every rank starts the step's clock together (a barrier: rank 0's logging
    between steps is not step time) and stops it after the loss all-reduce, which no rank
    leaves before every rank has updated. On GPUs the clock is CUDA events on the stream, which
    measure the device's step whatever the host did between steps, so no barrier synchronises
    the host every step. Phases are marked in between (trainer/throughput.py for what counts).
    """
    cfg, step = session.cfg, session.state.step
    phase = session.train_batches.phase_at(step)
    batch = session.train_batches.current_batch()  # the phase's, or the ramp's
    index, steps_in_process = step - session.start_step, (
        cfg.train.train_iters - session.start_step)
    if not torch.cuda.is_available():
        torch.distributed.barrier()
    profiler = start_profiler(index, steps_in_process, cfg.logging.exposed_comm)
    start, clock = time.perf_counter(), StepClock()
    session.mid_step = True  # until the update is applied: no checkpoint may be taken
    # Named ranges for the profiler plugin's trace (plugins/profiler/plugin.py).
    with torch.profiler.record_function("data wait"):
        microbatches = session.train_batches.take()
    clock.mark()
    with torch.profiler.record_function("forward-backward"):
        reports = _forward_backward(session, microbatches)
    clock.mark()
    with torch.profiler.record_function("optimizer"):
        updated, grad_norm, _ = session.optimizer.step()
    if updated:
        session.scheduler.step(increment=batch)
    clock.mark()
    totals = reduce_step_over_world(reports, clock.seconds(), trained_sequences(microbatches),
                                    stop.flags() if stop is not None else ())
    if stop is not None:
        stop.agree(totals.flags)
    mtp = mtp_losses(cfg, reports)
    loss, tokens, phases = totals.loss, totals.loss_tokens, totals.phase_seconds
    session.state.advance(batch, tokens)
    session.mid_step = False
    slowest = slowest_rank_figures(session, profiler, time.perf_counter() - start)
    step_time = slowest["step_time_s"]
    # Useful FLOPs of the sequences this step trained: full rows, or each packed row's
    # documents (trainer/throughput.py), summed over the DP replicas by the reduction above.
    step_cfg = phase_config(cfg, dataclasses.replace(phase, global_batch_size=batch))
    flops = training_flops(FlopsShape.from_config(step_cfg), totals.trained_tokens,
                           totals.squared_lengths)
    tflops = tflops_per_gpu(flops, step_time, torch.distributed.get_world_size())
    return StepMetrics(
        step=session.state.step,
        loss=loss,
        lr=session.optimizer.param_groups[0]["lr"],
        grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
        loss_tokens=tokens,
        step_time_s=step_time,
        skipped=not updated,
        data_wait_s=phases[0],
        forward_backward_s=phases[1],
        optimizer_s=phases[2],
        exposed_comm_s=slowest.get("exposed_comm_s"),
        model_flops=flops,
        model_tflops_per_gpu=tflops,
        mfu=model_flops_utilisation(tflops, run_peak_tflops(cfg)),
        measured=is_measured(index, steps_in_process, exposed_comm=cfg.logging.exposed_comm),
        memory_gib=slowest.get("memory_gib"),
        memory_reserved_gib=slowest.get("memory_reserved_gib"),
        stage_compute_s=slowest.get("stage_compute_s"),
        phase=phase.index,
        global_batch=batch,
        phase_name=phase.name,
        source_tokens=dict(session.train_batches.source_tokens),
        extra=mtp,
    )


def _memory_due(session) -> bool:
    """Peak memory is gathered on the steps the log line shows (and the last)."""
    step, cfg = session.state.step, session.cfg
    return step % max(1, cfg.logging.log_interval) == 0 or step == cfg.train.train_iters


def slowest_rank_figures(session, profiler, step_time: float) -> dict:
    """The step's figures that are a maximum over ranks, in one MAX all-reduce and only on the
    steps that need one: on profiled steps the slowest rank's exposed communication and step
    time (kept together as one share) and each pipeline stage's compute seconds; on logged
    steps the busiest rank's peak memory. Otherwise this rank's own step time."""
    stages, memory = session.cfg.layout.pipeline, _memory_due(session)
    values = []
    if profiler is not None:
        exposed, computed = stop_profiler(profiler)
        per_stage = [0.0] * stages
        per_stage[parallel_state.get_pipeline_model_parallel_rank()] = computed
        values += [exposed, step_time, *per_stage]
    reserved = peak_reserved_gib() if memory else None
    if memory:
        values.append(peak_memory_gib())
        if reserved is not None:
            values.append(reserved)
    maxima = max_over_world(values) if values else []
    figures: dict = {"step_time_s": step_time}
    if profiler is not None:
        figures.update(exposed_comm_s=maxima[0], step_time_s=maxima[1],
                       stage_compute_s=maxima[2:2 + stages])
    if memory:
        if reserved is None:
            figures["memory_gib"] = maxima[-1]
        else:
            figures["memory_gib"], figures["memory_reserved_gib"] = maxima[-2], maxima[-1]
    return figures


def evaluate(session) -> EvalResult:
    """Mean per-token loss over the held-out global batches (no gradients)."""
    cfg = session.cfg
    for chunk in session.model:
        chunk.eval()
    total_loss, total_tokens = 0.0, 0
    with torch.no_grad():
        for index in range(session.eval_steps):
            reports = run_schedule(
                session.model,
                session.heldout_batches.microbatches(index),
                session.plugins,
                seq_length=cfg.model.seq_length,
                micro_batch_size=cfg.train.micro_batch_size,
                forward_only=True,
            )
            loss, tokens = reduce_loss_over_world(reports)
            total_loss += loss * tokens
            total_tokens += tokens
    for chunk in session.model:
        chunk.train()
    return EvalResult(session.state.step, total_loss / max(total_tokens, 1), total_tokens)

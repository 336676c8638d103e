"""One optimizer step and one held-out evaluation through Megatron's pipeline schedules.

The step is timed as a whole optimizer step with its phases (data wait, forward-backward,
optimizer) and, on profiled steps, its exposed communication; see `trainer/step_clock.py`. Its
figures are summed over the world later, several steps at once (`trainer/step_figures.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from plugins.protocol.events import EvalResult, StepMetrics
from plugins.protocol.hooks import PluginSet
from trainer.data import MicroBatch
from trainer.device import to_compute_device
from trainer.metrics import (
    counted_sequences,
    local_loss_sums,
    max_over_world,
    reduce_loss_over_world,
)
from trainer.step_clock import (
    StepClock,
    peak_memory_gib,
    peak_reserved_gib,
    start_profiler,
    stop_profiler,
)
from trainer.step_figures import StepRecord, settle_steps
from trainer.throughput import is_measured, trained_sequences


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


def run_step(session) -> StepRecord:
    """Forward/backward over the next global batch's micro-batches, then one optimizer update;
    the session's run state advances by one step. What the step's figures need from the world
    stays on this rank (`trainer/step_figures.py`): no collective of ours, except the slowest
    rank's figures on the few profiled steps.

    On CPU ranks every rank starts the step's clock together (a barrier: rank 0's logging
    between steps is not step time). On GPUs the clock is CUDA events on the stream, which
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
    clock = StepClock()
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
    session.state.advance(batch)
    session.mid_step = False
    return StepRecord(
        step=session.state.step,
        phase=phase,
        global_batch=batch,
        lr=session.optimizer.param_groups[0]["lr"],
        grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
        skipped=not updated,
        clock=clock,
        losses=local_loss_sums(reports, cfg.layout.mtp_depths),
        sequences=counted_sequences(trained_sequences(microbatches)),
        measured=is_measured(index, steps_in_process, exposed_comm=cfg.logging.exposed_comm),
        profiled=profiled_figures(session, profiler),
        memory=memory_peaks(session),
        source_tokens=dict(session.train_batches.source_tokens),
    )


def train_step(session) -> StepMetrics:
    """`run_step` with its figures summed over the world at once: for tools and tests that
    read every step's loss (the loop sums them at the log interval instead)."""
    return settle_steps(session, [run_step(session)])[0]


def memory_peaks(session) -> tuple[float, ...] | None:
    """This rank's peak memory on the steps the log line shows (and the last): allocated, and
    on GPU reserved too (`trainer/step_clock.py`); None on other steps."""
    step, cfg = session.state.step, session.cfg
    if step % max(1, cfg.logging.log_interval) and step != cfg.train.train_iters:
        return None
    reserved = peak_reserved_gib()
    return (peak_memory_gib(),) if reserved is None else (peak_memory_gib(), reserved)


def profiled_figures(session, profiler) -> dict:
    """On a profiled step, in one MAX all-reduce: the slowest rank's exposed communication and
    each pipeline stage's compute seconds (its busiest rank); on other steps none."""
    if profiler is None:
        return {}
    stages = session.cfg.layout.pipeline
    exposed, computed = stop_profiler(profiler)
    per_stage = [0.0] * stages
    per_stage[parallel_state.get_pipeline_model_parallel_rank()] = computed
    maxima = max_over_world([exposed, *per_stage])
    return {"exposed_comm_s": maxima[0], "stage_compute_s": maxima[1:]}


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

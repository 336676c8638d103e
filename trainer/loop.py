"""The step loop: train, check, report, evaluate, checkpoint; plugins hear each event.

Per step: `run_step` -> skipped-update count (fp16 overflow) -> `after_update` hook; then, when
figures are due (a log line, an evaluation, a checkpoint, a stop, the last step, a non-finite
gradient norm), every step since the last is summed over the world in one reduction
(`trainer/step_figures.py`) and each, in order, goes through the non-finite check, the history,
the `after_step` hook (plugins may add figures) and the report -> held-out evaluation when due
(`after_eval` hook) -> checkpoint when due. Nothing here knows a specific plugin; every plugin
attaches through the session's `PluginSet`. With `checkpoint.async_save` every step ends by
publishing the background saves that every rank has finished writing, and the run does not end
(at its last step, or on SIGTERM: scancel, a requeue, torchrun stopping the ranks) before its
saves are published. Ctrl-C (and SIGTERM with `checkpoint.save_on_stop`) stops every rank
together at the end of the first step that begins after the signal, saving it first when
`checkpoint.save_on_stop` asks; the stop is recorded in metrics.jsonl, from which the
launching process says it in one line. A stop after the run's last step began stops nothing:
the run ends as a finished one (its evaluation, save and summary).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal

import torch

from plugins.protocol.events import RunStart, StepMetrics
from recipes.config.phases import continue_overrides, launch_stop
from trainer.checkpoint import async_save
from trainer.checkpoint.format import RUN_CHECKPOINTS
from trainer.checkpoint.save import save_checkpoint
from trainer.gpu_fast_paths import CudaGraphs
from trainer.metrics import LaterWorldSum, RunReporter
from trainer.session import TrainingSession
from trainer.state import RunHistory
from trainer.step import evaluate, run_step
from trainer.step_figures import StepRecord, settle_steps
from trainer.throughput import trainer_profiled_steps


class NonFiniteError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the message names step and rank."""


def _ranks_with_nonfinite_grads(model: list) -> list[int]:
    """Ranks whose own gradient buffers hold NaN/inf (gathered from every rank)."""
    local_bad = any(
        not torch.isfinite(buffer.grad_data).all()
        for chunk in model
        for buffer in chunk.buffers + chunk.expert_parallel_buffers
    )
    flags = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(flags, local_bad)
    return [rank for rank, bad in enumerate(flags) if bad]


def check_finite(session: TrainingSession, metrics: StepMetrics) -> None:
    """Stop every rank when the (global) loss or grad norm is NaN/inf, naming the ranks.

    Loss and grad norm are already reduced over all ranks, so every rank takes the same branch;
    the per-rank search runs only on failure and costs nothing on healthy steps.
    """
    # A skipped update (fp16 overflow) has no grad norm by design; the loss scaler handles it.
    if math.isfinite(metrics.loss) and (metrics.skipped or math.isfinite(metrics.grad_norm)):
        return
    ranks = _ranks_with_nonfinite_grads(session.model)
    if not ranks:
        where = "gradients finite on every rank"
    elif len(ranks) == torch.distributed.get_world_size():
        where = "NaN/inf gradients on all ranks"
    else:
        where = "NaN/inf gradients on rank " + ", ".join(map(str, ranks))
    fix = "lower optimizer.lr or raise scheduler.warmup_iters"
    if session.cfg.precision.dtype == "fp16":  # fp16's narrow range is a cause only there
        fix = "lower optimizer.lr, raise scheduler.warmup_iters or use precision.dtype=bf16/fp32 " \
            "instead of fp16"
    raise NonFiniteError(
        f"non-finite values at step {metrics.step}: loss {metrics.loss}, grad norm "
        f"{metrics.grad_norm} ({where}); {fix}"
    )


def loss_scale(session: TrainingSession) -> float:
    """The optimizer's current loss scale (1.0 without loss scaling); a read from the device."""
    return float(session.optimizer.get_loss_scale())


def as_megatron_keeps(scale: float) -> float:
    """`scale` as Megatron keeps a loss scale and its floor: a float32 tensor
    (`optimizer/grad_scaler.py`); 1e30 is 1.0000000150e30 there."""
    return float(torch.tensor(scale, dtype=torch.float32))


def cannot_go_lower(precision, scale: float) -> bool:
    """Whether the loss scale `scale` cannot be lowered after another overflow: a static scale
    never changes; a dynamic one stops at `precision.min_loss_scale`."""
    return precision.loss_scale is not None or scale <= as_megatron_keeps(
        precision.min_loss_scale)


def record_skipped_update(
    session: TrainingSession, reporter: RunReporter, step: int, floored_before: bool
) -> bool:
    """Count a step whose update the optimizer skipped and say so; returns whether the scale
    it left cannot go lower (`cannot_go_lower`). The scale is stuck, and the run stops, when a
    step overflows right after one that overflowed and left it there: Megatron would skip
    every remaining step (a static scale or a dynamic one at its floor overflows again)."""
    session.state.skip()
    p, scale = session.cfg.precision, loss_scale(session)
    reporter.print(
        f"step {step}: gradients overflowed; update skipped, loss scale now {scale:g} "
        f"({session.state.skipped_steps} skipped so far)"
    )
    if session.cfg.train.exit_on_nonfinite and floored_before:
        raise NonFiniteError(stuck_scale_message(p, step))
    return cannot_go_lower(p, scale)


def stuck_scale_message(precision, step: int) -> str:
    """The one line of a run stopped because its loss scale cannot avoid the overflow."""
    where, fix = (f"even at precision.min_loss_scale={precision.min_loss_scale:g}",
                  "lower optimizer.lr, raise scheduler.warmup_iters")
    if precision.loss_scale is not None:
        where, fix = (f"at the static precision.loss_scale={precision.loss_scale:g}",
                      "lower precision.loss_scale, set precision.loss_scale=null (dynamic "
                      "scaling)")
    return (f"gradients overflowed on steps {step - 1} and {step} {where}; {fix} or use "
            "precision.dtype=bf16 instead of fp16")


def _due(step: int, interval: int, total: int) -> bool:
    return step == total or (interval > 0 and step % interval == 0)


def _evaluate(session: TrainingSession, history: RunHistory, reporter: RunReporter) -> None:
    result = evaluate(session)
    history.heldout.append((result.step, result.loss))
    reporter.heldout(result)
    session.plugins.after_eval(result)


@contextlib.contextmanager
def manual_gc(interval: int):
    """With `train.manual_gc_interval` > 0: Python's automatic collection off for the loop
    (after one full collection, as Megatron-LM does), and `collect(step)` collects every
    `interval` steps, on every rank at the same step."""
    if interval <= 0:
        yield lambda step: None
        return
    gc.collect()
    gc.disable()
    try:
        yield lambda step: gc.collect() if step % interval == 0 else None
    finally:
        gc.enable()


def announce_phase(session: TrainingSession, reporter: RunReporter) -> None:
    """One line when a phase starts (a run with phases only), saying what it trains on."""
    spans, step = session.train_batches.spans, session.state.step
    phase = session.train_batches.phase_at(step)
    if len(spans) > 1 and (step == phase.start_step or step == session.start_step):
        reporter.print(
            f"phase {phase.index + 1}/{len(spans)} '{phase.name}' at step {step} (steps "
            f"{phase.start_step}-{phase.end_step}): blend {phase.blend or session.cfg.data.source}"
            f", global batch {phase.global_batch_size}, sequence {phase.seq_length}"
            + (", lr decays" if phase.lr_decay else ""))


class StopRequest:
    """A stop signal (Ctrl-C's SIGINT; SIGTERM with `checkpoint.save_on_stop` or asynchronous
    saves) noted by the handler and acted on by every rank together at a step boundary: a rank
    inside a collective cannot stop alone. Each rank starts a sum of its flags over the world
    when a step begins and reads it when the step ends (`LaterWorldSum`: by then every rank
    began the step and gave its part, so nobody waits for it), so every rank stops after the
    same step: the first that begins after the signal. The same signal again stops this rank
    at once (a rank stuck in a collective)."""

    ORDER = (signal.SIGTERM, signal.SIGINT)  # when ranks noted different signals, the first

    def __init__(self):
        self.signum: int = 0
        self.agreed: int = 0  # the signal every rank agreed to stop for (0: none)
        self.started: LaterWorldSum | None = None

    def note(self, signum, frame) -> None:
        if self.signum == signum:  # asked twice: at once, as the signal would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = self.signum or signum

    def flags(self) -> tuple[float, ...]:
        """This rank's part of the sum: 1 for the signal it noted."""
        return tuple(float(self.signum == signum) for signum in self.ORDER)

    def agree(self, summed: tuple[float, ...]) -> None:
        """Every rank's flags, summed: the signal some rank noted, the same on every rank."""
        self.agreed = next((int(s) for s, n in zip(self.ORDER, summed, strict=True) if n), 0)

    def begin_step(self) -> None:
        """Start the sum of the flags this rank noted so far."""
        self.started = LaterWorldSum(self.flags())

    def end_step(self) -> None:
        """Agree on the sum this step began with."""
        self.agree(self.started.result())
        self.started = None


def stop_signals(cfg) -> tuple[int, ...]:
    """The signals a run stops at a step boundary for: Ctrl-C always (a person stopping a run
    wants its steps kept whole); SIGTERM when a checkpoint is to be saved or published on the
    way out, else it ends the ranks at once as before (torchrun's way of stopping a node whose
    ranks failed: a rank stuck in a collective would not reach the boundary)."""
    term = cfg.checkpoint.save_on_stop or cfg.checkpoint.async_save
    return (signal.SIGINT, signal.SIGTERM) if term else (signal.SIGINT,)


@contextlib.contextmanager
def stops_between_steps(session: TrainingSession):
    """The stop signals become a `StopRequest` for the loop; on the way out the pending saves
    are published and the signal, unless the run has nothing left to do (`run_training`
    clears it), then ends the process as it would have (its launcher says the one line)."""
    request = StopRequest()
    signals = stop_signals(session.cfg)
    previous = {signum: signal.signal(signum, request.note) for signum in signals}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if request.signum:  # the saves are published: stop as signalled
        signal.signal(request.signum, signal.SIG_DFL)
        os.kill(os.getpid(), request.signum)


def run_training(session: TrainingSession, reporter: RunReporter) -> RunHistory:
    """The step loop from the session's step to `train.train_iters`; returns its history."""
    with manual_gc(session.cfg.train.manual_gc_interval) as collect, \
            stops_between_steps(session) as stop:
        history = _train(session, reporter, collect, stop)
        async_save.finish_saves(session, blocking=True)
        if stop.signum and run_complete(session):
            reporter.print(f"{signal.Signals(stop.signum).name} came after the last step "
                           f"began: the run is complete ({session.state.step} steps) and ends "
                           "as usual")
            stop.signum = 0  # nothing is left to continue: not a stopped run
        return history


def run_complete(session: TrainingSession) -> bool:
    """Whether the run has trained its last step (a launch that ends where a later phase
    starts a new launch has not)."""
    return session.state.step >= session.cfg.train.train_iters


def stop_here(session: TrainingSession, history: RunHistory, reporter: RunReporter,
              signum: int) -> None:
    """Every rank agreed to stop after this step: save it when asked (unless just saved), and
    record the stop in metrics.jsonl for the launcher's one line."""
    cfg, step = session.cfg, session.state.step
    saved = history.checkpoint if history.checkpoint and history.checkpoint.endswith(
        f"step_{step:07d}") else None
    if cfg.checkpoint.save_on_stop and saved is None:
        saved = str(save_checkpoint(session, session.run_dir / RUN_CHECKPOINTS))
        history.checkpoint = saved
    reporter.record("stopped", {"step": step, "signal": signal.Signals(signum).name,
                                "checkpoint": saved})


def _train(session: TrainingSession, reporter: RunReporter, collect,
           stop: StopRequest) -> RunHistory:
    cfg, history = session.cfg, RunHistory()
    start = session.state.step
    # A phase that changes the sequence length or CP size starts a new launch: this one ends
    # at its boundary, with a checkpoint; resumed at that boundary in the layout before it (a
    # requeue after its last save), it trains nothing (recipes/config/phases.py).
    total = launch_stop(cfg, start)
    reporter.continue_from(start)  # an earlier attempt's records past `start` are redone
    profiled = trainer_profiled_steps(start, total, cfg.logging.exposed_comm)
    session.plugins.run_start(RunStart(cfg, session.run_dir, start, total, profiled))
    if session.eval_steps > 0:
        _evaluate(session, history, reporter)
    graphs = CudaGraphs(session, session.model_config)
    try:
        return _steps(session, reporter, collect, stop, history, total, graphs)
    finally:
        graphs.close()


def _steps(session: TrainingSession, reporter: RunReporter, collect, stop: StopRequest,
           history: RunHistory, total: int, graphs: CudaGraphs) -> RunHistory:
    """The steps of `_train` up to `total` (Transformer Engine's CUDA graphs, if any, captured
    after their warm-up steps); their figures summed when `_figures_due`."""
    cfg = session.cfg
    pending: list[StepRecord] = []
    floored = False  # the last step overflowed and left a loss scale that cannot go lower
    while session.state.step < total:
        graphs.before_step(session.state.step)
        announce_phase(session, reporter)
        stop.begin_step()
        record = run_step(session)
        stop.end_step()
        # The scale is read only after a skipped step (the step already waited for its
        # overflow flag): a read before every step would wait for the last step's kernels.
        floored = record.skipped and record_skipped_update(session, reporter, record.step,
                                                          floored)
        collect(record.step)
        session.plugins.after_update(record.step)
        reporter.reached(record.step)
        pending.append(record)
        step = record.step
        evaluate_now = session.eval_steps > 0 and _due(step, cfg.train.eval_interval, total)
        save_now = cfg.checkpoint.save and _due(step, cfg.checkpoint.save_interval, total)
        if evaluate_now or save_now or stop.agreed or _figures_due(cfg, record, total):
            for metrics in settle_steps(session, pending):
                _report_step(session, reporter, history, metrics, total)
            pending.clear()
        if evaluate_now:
            _evaluate(session, history, reporter)
        # After the whole optimizer step: the only place a run saves (docs/checkpoints.md).
        if save_now:
            history.checkpoint = str(save_checkpoint(session, session.run_dir / RUN_CHECKPOINTS))
        if cfg.checkpoint.async_save:
            async_save.finish_saves(session, blocking=False)
        if stop.agreed and not run_complete(session):  # the last step: the run ends anyway
            stop_here(session, history, reporter, stop.agreed)
            return history
    if total < cfg.train.train_iters:
        announce_relaunch(session, reporter, total)
    return history


def _figures_due(cfg, record: StepRecord, total: int) -> bool:
    """Whether the loop sums the figures of the steps so far now: the log line's steps (and
    the last); at once after a non-finite gradient norm (the same on every rank), so
    `check_finite` stops the run at that step."""
    nonfinite = cfg.train.exit_on_nonfinite and not record.skipped and not math.isfinite(
        record.grad_norm)
    return nonfinite or _due(record.step, max(1, cfg.logging.log_interval), total)


def _report_step(session: TrainingSession, reporter: RunReporter, history: RunHistory,
                 metrics: StepMetrics, total: int) -> None:
    """One settled step: checked, kept in the history, heard by the plugins, reported."""
    if session.cfg.train.exit_on_nonfinite:
        check_finite(session, metrics)
    history.record_step(metrics.loss, metrics.step_time_s, metrics.loss_tokens,
                        metrics.model_flops)
    session.plugins.after_step(metrics)  # plugins may add figures to metrics.extra
    reporter.step(metrics, total)


def announce_relaunch(session: TrainingSession, reporter: RunReporter, step: int) -> None:
    """The line that says how the next phase's launch continues this run."""
    span = session.train_batches.phase_at(step)
    reporter.print(
        f"phase '{span.name}' starts at step {step} in a new launch: continue with "
        f"scripts/pretrain.py config={session.run_dir / 'config.yaml'} "
        f"run_dir={session.run_dir} {' '.join(continue_overrides(span))}")

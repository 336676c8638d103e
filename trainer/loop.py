"""Build a training session on this rank and run it: the trainer's top level.

Order (each a named function): seeds -> transformer config (+ plugin hook) -> model chunks ->
optional weights -> DDP -> optimizer + scheduler -> data -> steps (log, eval, checkpoint) ->
summary. Plugins attach through `TrainerHooks`; nothing here knows about a specific plugin.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from recipes.schema import RunConfig
from trainer import checkpointing
from trainer.data import GlobalBatches, load_samples
from trainer.hooks import TrainerHooks
from trainer.mcore_translation import (
    build_ddp_config,
    build_optimizer_config,
    build_transformer_config,
)
from trainer.metrics import RunReporter, StepMetrics
from trainer.model import build_model_chunks, wrap_for_precision, wrap_with_ddp
from trainer.step import evaluate, train_step


class NonFiniteError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the message names step and rank."""


@dataclass
class TrainingSession:
    cfg: RunConfig
    run_dir: Path
    hooks: TrainerHooks
    model: list
    optimizer: object
    scheduler: OptimizerParamScheduler
    train_batches: GlobalBatches
    heldout_batches: GlobalBatches
    eval_steps: int
    start_step: int = 0


def set_seeds(seed: int) -> None:
    # Megatron-LM's convention: each pipeline stage draws its own stream (dropout differs).
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def build_scheduler(cfg: RunConfig, optimizer) -> OptimizerParamScheduler:
    """Schedules count samples, as Megatron-LM does when it steps by the global batch."""
    s, gbs = cfg.scheduler, cfg.train.global_batch_size
    decay_iters = s.decay_iters or cfg.train.train_iters
    wsd_iters = s.wsd_decay_iters or max(1, decay_iters // 10)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=cfg.optimizer.lr,
        min_lr=cfg.optimizer.min_lr,
        lr_warmup_steps=s.warmup_iters * gbs,
        lr_decay_steps=decay_iters * gbs,
        lr_decay_style={"wsd": "WSD"}.get(s.style, s.style),
        start_wd=cfg.optimizer.weight_decay,
        end_wd=cfg.optimizer.weight_decay,
        wd_incr_steps=decay_iters * gbs,
        wd_incr_style="constant",
        wsd_decay_steps=wsd_iters * gbs if s.style == "wsd" else None,
        lr_wsd_decay_style=s.wsd_decay_style if s.style == "wsd" else None,
    )


def _wire_schedule_hooks(cfg: RunConfig, config, model: list, optimizer) -> None:
    """Give Megatron's schedules the DDP/optimizer callbacks Megatron-LM would set."""
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if cfg.optimizer.overlap_grad_reduce:
        # Only with overlap: grad_sync_func without it reduce-scatters twice (silently wrong).
        no_sync = [chunk.no_sync for chunk in model]
        grad_sync = [chunk.start_grad_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if cfg.optimizer.overlap_param_gather:
        param_sync = [chunk.start_param_sync for chunk in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync


def build_session(
    cfg: RunConfig, run_dir: Path, hooks: TrainerHooks, *, cpu_initialization: bool
) -> TrainingSession:
    set_seeds(cfg.train.seed)
    config = build_transformer_config(cfg, cpu_initialization=cpu_initialization)
    config = hooks.apply_transformer_config(cfg, config)
    chunks = build_model_chunks(cfg, config, hooks)
    if cfg.checkpoint.load is not None and cfg.checkpoint.load_model_only:
        checkpointing.load_model_weights(cfg.checkpoint.load, chunks)
    model = wrap_with_ddp(wrap_for_precision(chunks, config), config, build_ddp_config(cfg))
    optimizer = get_megatron_optimizer(build_optimizer_config(cfg), model)
    scheduler = build_scheduler(cfg, optimizer)
    _wire_schedule_hooks(cfg, config, model, optimizer)
    start_step = 0
    if cfg.checkpoint.load is not None and not cfg.checkpoint.load_model_only:
        start_step = checkpointing.load_checkpoint(cfg.checkpoint.load, model, optimizer, scheduler)
    samples = load_samples(cfg)
    dp_rank = parallel_state.get_data_parallel_rank()
    train_batches = GlobalBatches(samples.train, cfg, dp_rank, samples.eod)
    heldout_batches = GlobalBatches(samples.heldout, cfg, dp_rank, samples.eod)
    eval_steps = min(cfg.train.eval_iters, len(samples.heldout) // cfg.train.global_batch_size)
    return TrainingSession(
        cfg, run_dir, hooks, model, optimizer, scheduler, train_batches, heldout_batches,
        eval_steps, start_step,
    )


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
    if math.isfinite(metrics.loss) and math.isfinite(metrics.grad_norm):
        return
    ranks = _ranks_with_nonfinite_grads(session.model)
    if not ranks:
        where = "gradients finite on every rank"
    elif len(ranks) == torch.distributed.get_world_size():
        where = "NaN/inf gradients on all ranks"
    else:
        where = "NaN/inf gradients on rank " + ", ".join(map(str, ranks))
    raise NonFiniteError(
        f"non-finite values at step {metrics.step}: loss {metrics.loss}, grad norm "
        f"{metrics.grad_norm} ({where}); lower optimizer.lr, raise scheduler.warmup_iters or "
        "use precision.dtype=bf16/fp32 instead of fp16"
    )


def _due(step: int, interval: int, total: int) -> bool:
    return step == total or (interval > 0 and step % interval == 0)


def run_training(session: TrainingSession, reporter: RunReporter) -> dict:
    """The step loop; returns the figures the summary prints."""
    cfg = session.cfg
    total = cfg.train.train_iters
    history = {"first_loss": None, "final_loss": None, "heldout": [], "step_times": []}
    if session.eval_steps > 0:
        loss0 = evaluate(session)
        history["heldout"].append((session.start_step, loss0))
        reporter.heldout(session.start_step, loss0)
    for step in range(session.start_step, total):
        metrics = train_step(session, step)
        if cfg.train.exit_on_nonfinite:
            check_finite(session, metrics)
        history["first_loss"] = history["first_loss"] or metrics.loss
        history["final_loss"] = metrics.loss
        history["step_times"].append((metrics.step_time_s, metrics.loss_tokens))
        reporter.step(metrics, total)
        session.hooks.notify_after_step(metrics)
        if session.eval_steps > 0 and _due(metrics.step, cfg.train.eval_interval, total):
            heldout = evaluate(session)
            history["heldout"].append((metrics.step, heldout))
            reporter.heldout(metrics.step, heldout)
        if cfg.checkpoint.save and _due(metrics.step, cfg.checkpoint.save_interval, total):
            path = checkpointing.save_checkpoint(
                session.run_dir / "checkpoints", cfg, session.model, session.optimizer,
                session.scheduler, metrics.step,
            )
            history["checkpoint"] = str(path)
    return history

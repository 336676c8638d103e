"""A training session on this rank: runtime, process groups, model, optimizer, data, run state.

Order (each a named function): plugins' runtime setup -> default process group -> Megatron's
parallel state -> seeds -> transformer config (+ plugin hook) -> model chunks (+ layer-spec
hook) -> optional weights -> precision wrapper and DDP -> optimizer + scheduler -> data ->
optional full checkpoint (run state included). Plugins attach only through the `PluginSet`.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.optimizer import MegatronOptimizer, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from plugins.protocol.errors import ConfigError
from plugins.protocol.events import RuntimeContext
from plugins.protocol.hooks import PluginSet
from plugins.registry import build_plugins
from recipes.config.phases import launch_mismatch, phase_config, phase_spans, schedule_samples
from recipes.config.rampup import megatron_schedule, ramp_schedule
from recipes.config.schema import RunConfig
from trainer import gpu_fast_paths
from trainer.checkpoint.load import (
    load_checkpoint,
    load_fsdp_weights,
    load_model_weights,
    resolve_checkpoint_dir,
    saved_as_fsdp_dtensor,
)
from trainer.cpu_runtime.runtime import runtime_for
from trainer.data import (
    GlobalBatches,
    PhasedBatches,
    build_sources,
    eval_batches_note,
    heldout_batch_problem,
)
from trainer.mcore_translation import (
    build_ddp_config,
    build_optimizer_config,
    build_transformer_config,
    fusions_line,
    initialize_parallel_state,
)
from trainer.model import (
    build_model_chunks,
    transformer_engine_in_use,
    wrap_for_precision,
    wrap_with_ddp,
)
from trainer.state import RngState, RunState
from trainer.step_fixes import apply_step_fixes


@dataclass
class TrainingSession:
    """Everything one rank trains with; `state` is where the run stands."""

    cfg: RunConfig
    run_dir: Path
    plugins: PluginSet
    model: list[DistributedDataParallel]  # one per virtual pipeline stage
    optimizer: MegatronOptimizer
    scheduler: OptimizerParamScheduler
    train_batches: PhasedBatches
    heldout_batches: GlobalBatches | None  # None with train.eval_iters=0 (never evaluated)
    eval_steps: int  # held-out global batches per evaluation (0 = no evaluation)
    state: RunState
    start_step: int = 0  # the step this session started from (a resume's step, or 0)
    # The step directory a full resume loaded (rotation never deletes it); None otherwise.
    resumed_from: Path | None = None
    mid_step: bool = False  # set by train_step while a step is under way (no saves then)
    async_saves: Any = None  # checkpoint.async_save: trainer.checkpoint.async_save.AsyncSaves
    model_config: Any = None  # Megatron's TransformerConfig the chunks were built from

    def capture_state(self) -> RunState:
        """The run state as a checkpoint saves it: counters, data position, plugins, RNG."""
        return RunState(
            step=self.state.step,
            consumed_samples=self.state.consumed_samples,
            consumed_tokens=self.state.consumed_tokens,
            skipped_steps=self.state.skipped_steps,
            data=self.train_batches.state_dict(),
            plugins=self.plugins.state_dict(),
            world_size=torch.distributed.get_world_size(),
            rng=RngState.capture(),
        )

    def restore_state(self, state: RunState) -> None:
        """Continue from a loaded run state (RNG streams only when the checkpoint had them)."""
        self.state = state
        self.start_step = state.step
        self.train_batches.load_state_dict(state.data)
        self.train_batches.step = state.step
        self.train_batches.consumed = state.consumed_samples
        self.plugins.load_state_dict(state.plugins)
        if state.rng is not None:
            state.rng.restore()


def start_runtime(cfg: RunConfig) -> tuple[PluginSet, RuntimeContext]:
    """Where this rank computes (the CPU runtime on CPU ranks), told to the plugins; then the
    default process group and Megatron's parallel state."""
    plugins = build_plugins(cfg)
    runtime = plugins.setup_runtime(runtime_for(cfg.cluster))
    if runtime.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(  # how long a collective waits for a lost rank
            backend=runtime.backend,
            timeout=timedelta(minutes=cfg.train.distributed_timeout_minutes),
        )
    initialize_parallel_state(
        cfg.layout, timeout_minutes=cfg.train.distributed_timeout_minutes,
        options=cfg.plugins.process_group_options(cfg))
    return plugins, runtime


def start_session(cfg: RunConfig, run_dir: Path) -> TrainingSession:
    """The whole set-up of one rank: runtime, process groups and the training session."""
    plugins, runtime = start_runtime(cfg)
    return build_session(cfg, run_dir, plugins, runtime)


def set_seeds(seed: int, te_rng_tracker: bool = False) -> None:
    """`te_rng_tracker`: Transformer Engine's RNG tracker, which CUDA-graphed layers draw from
    (`TransformerConfig.use_te_rng_tracker`, set with every CUDA graph)."""
    # Megatron-LM's convention: each pipeline stage draws its own stream (dropout differs).
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, te_rng_tracker=te_rng_tracker)


def build_scheduler(cfg: RunConfig, optimizer) -> OptimizerParamScheduler:
    """Schedules count samples, as Megatron-LM does when it steps by the global batch; one
    schedule runs across every phase (recipes/config/phases.py `schedule_samples`)."""
    s, samples = cfg.scheduler, schedule_samples(cfg)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=cfg.optimizer.lr,
        min_lr=cfg.optimizer.min_lr,
        lr_warmup_steps=samples.warmup,
        lr_decay_steps=samples.decay,
        lr_decay_style={"wsd": "WSD"}.get(s.style, s.style),
        start_wd=cfg.optimizer.weight_decay,
        end_wd=cfg.optimizer.weight_decay,
        wd_incr_steps=samples.decay,
        wd_incr_style="constant",
        wsd_decay_steps=samples.wsd_decay if s.style == "wsd" else None,
        lr_wsd_decay_style=s.wsd_decay_style if s.style == "wsd" else None,
        # On resume this run's lr, schedule and batch apply (stated before launch); only the
        # position, the samples consumed (`num_steps`), comes from the checkpoint. Megatron's
        # default keeps the checkpoint's values silently (optimizer_param_scheduler.py:328-339).
        override_opt_param_scheduler=True,
        use_checkpoint_opt_param_scheduler=False,
    )


def _per_chunk(functions: list):
    """Megatron's schedules take one callable for one chunk, a list for several."""
    return functions[0] if len(functions) == 1 else functions


def _wire_schedule_hooks(cfg: RunConfig, config, model: list, optimizer) -> None:
    """Give Megatron's schedules the DDP/optimizer callbacks Megatron-LM would set."""
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if cfg.optimizer.overlap_grad_reduce:
        # Only with overlap: grad_sync_func without it reduce-scatters twice (silently wrong).
        config.no_sync_func = _per_chunk([chunk.no_sync for chunk in model])
        config.grad_sync_func = _per_chunk([chunk.start_grad_sync for chunk in model])
    if cfg.optimizer.overlap_param_gather:
        config.param_sync_func = _per_chunk([chunk.start_param_sync for chunk in model])


@contextlib.contextmanager
def patient_collectives(minutes: int, usual_minutes: int):
    """The default group's collective timeout raised to `minutes` for a while: Megatron's
    dataset builder and the pack indexes are built by rank 0 while the others wait in a
    barrier (`datasets/blended_megatron_dataset_builder.py:398, 451, 542`), which a first
    build of a large blend would otherwise time out."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(minutes=minutes))
    try:
        yield
    finally:
        _set_pg_timeout(timedelta(minutes=usual_minutes))


def batch_ramp(cfg: RunConfig):
    """Megatron Core's step-batch calculator for `train.rampup_batch_size` (the ramp written as
    its schedule by recipes/config/rampup.py), held by the run rather than Megatron's global."""
    from megatron.core.num_microbatches_calculator import (
        StepBatchsizeNumMicroBatchesCalculator,
    )

    schedule = ramp_schedule(cfg)
    if schedule is None:
        return None
    return StepBatchsizeNumMicroBatchesCalculator(
        micro_batch_size=cfg.train.micro_batch_size, data_parallel_size=cfg.layout.data_parallel,
        decrease_batch_size_if_needed=False, rank=torch.distributed.get_rank(),
        schedule=megatron_schedule(schedule))


def _data(cfg: RunConfig, run_dir: Path) -> tuple[PhasedBatches, GlobalBatches | None, int]:
    """One training stream per distinct blend of the run's phases (built for the samples its
    phases take); held-out batches from the first phase's data at this launch's sequence
    length, none with `train.eval_iters=0` (the split is still kept out of training, as
    Megatron-LM keeps its validation split, but its size is then nobody's concern)."""
    t, spans = cfg.train, phase_spans(cfg)
    dp_rank = parallel_state.get_data_parallel_rank()
    streams: dict[str, GlobalBatches] = {}
    heldout_source, any_heldout = None, None  # each with its training source: (train, heldout)
    with patient_collectives(t.data_setup_timeout_minutes, t.distributed_timeout_minutes):
        for span in spans:
            key = PhasedBatches.stream_key(span)
            if key in streams:
                continue
            samples = sum(s.samples for s in spans if PhasedBatches.stream_key(s) == key)
            phase_cfg = phase_config(cfg, span)
            train_source, heldout = build_sources(phase_cfg, run_dir, samples)
            streams[key] = GlobalBatches(train_source, phase_cfg, dp_rank)
            any_heldout = (train_source, heldout) if any_heldout is None else any_heldout
            if heldout_source is None and span.seq_length == cfg.model.seq_length:
                # the first data at this launch's sequence length
                heldout_source = (train_source, heldout)
    if heldout_source is None:  # a launch in another phase's layout is refused next
        heldout_source = any_heldout
    train = PhasedBatches(spans, streams, batch_ramp(cfg))
    if cfg.train.eval_iters == 0:
        return train, None, 0
    heldout = checked_heldout(cfg, *heldout_source)
    heldout_batches = GlobalBatches(heldout, cfg, dp_rank)
    eval_steps = min(cfg.train.eval_iters, len(heldout) // cfg.train.global_batch_size)
    return train, heldout_batches, eval_steps


def checked_heldout(cfg: RunConfig, train, heldout):
    """The held-out source, refused in one line when it holds less than one global batch; an
    evaluation it cuts short of `train.eval_iters` batches is noted once (rank 0): Megatron-LM
    would evaluate them all, its validation set built for `eval_iters` batches."""
    samples = len(train) + len(heldout)  # the data the held-out split was taken from
    problem = heldout_batch_problem(cfg, len(heldout), samples)
    if problem:
        raise ConfigError(problem)
    note = eval_batches_note(cfg, len(heldout), samples)
    if note and torch.distributed.get_rank() == 0:
        print(note, flush=True)
    return heldout


def build_session(
    cfg: RunConfig, run_dir: Path, plugins: PluginSet, runtime: RuntimeContext
) -> TrainingSession:
    te = transformer_engine_in_use(cfg)
    config = build_transformer_config(cfg, cpu_initialization=runtime.cpu_initialization,
                                      transformer_engine=te)
    set_seeds(cfg.train.seed, te_rng_tracker=config.use_te_rng_tracker)
    config = plugins.transformer_config(config)
    if te and torch.distributed.get_rank() == 0:
        print(fusions_line(config), flush=True)
    gpu_fast_paths.initialize_userbuffers(cfg, config)
    chunks: list = []
    with gpu_fast_paths.wgrad_fusion_without_apex(config, chunks):
        chunks += build_model_chunks(cfg, config, plugins)
    load = cfg.checkpoint.load
    weights_only = load is not None and cfg.checkpoint.load_model_only
    # Megatron FSDP's fsdp_dtensor weights load into its wrapped chunks, any other before DDP.
    fsdp_weights = weights_only and saved_as_fsdp_dtensor(load)
    if weights_only and not fsdp_weights:
        load_model_weights(load, chunks)
    model = wrap_with_ddp(wrap_for_precision(chunks, config), config, build_ddp_config(cfg))
    if fsdp_weights:
        load_fsdp_weights(cfg, load, model)
    apply_step_fixes()  # Megatron's step defects, mended before its optimizer exists
    optimizer = get_megatron_optimizer(build_optimizer_config(cfg), model)
    scheduler = build_scheduler(cfg, optimizer)
    _wire_schedule_hooks(cfg, config, model, optimizer)
    train, heldout, eval_steps = _data(cfg, run_dir)
    session = TrainingSession(
        cfg=cfg, run_dir=run_dir, plugins=plugins, model=model, optimizer=optimizer,
        scheduler=scheduler, train_batches=train, heldout_batches=heldout,
        eval_steps=eval_steps, state=RunState(world_size=torch.distributed.get_world_size()),
        model_config=config,
    )
    if load is not None and not cfg.checkpoint.load_model_only:
        session.resumed_from = resolve_checkpoint_dir(load)
        session.restore_state(load_checkpoint(session, session.resumed_from))
    mismatch = launch_mismatch(cfg, session.start_step)  # a phase that needs its own layout
    if mismatch is not None:
        raise ConfigError(mismatch)
    return session

"""What a checkpoint holds, as the sharded state dicts Megatron's `dist_checkpointing` saves and
loads, and the strategy a save writes them with (and, for Megatron-LM's layout, what its
`load_checkpoint` reads, and how a step Megatron-LM or Megatron Bridge wrote becomes a run state).

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict. Tensors are keyed by global names (layer numbers include the pipeline offset), so
weights saved from one layout load into any other. A full checkpoint holds model, optimizer,
scheduler and the typed `RunState` (step, consumed samples and tokens, data position, plugin
states; each rank's RNG streams as a sharded object), so resuming restores all of it; with fp16
the optimizer's part holds the loss scaler's scale, growth tracker and hysteresis tracker
(`grad_scaler` in Megatron's optimizer state dict, optimizer/optimizer.py:1133-1134 and
1208-1213). The save (`save.py`, `async_save.py`) and the load (`load.py`) build the same dicts
here; the HF interop's Megatron template uses `content_metadata` too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.utils import unwrap_model

from recipes.config.schema import RunConfig
from trainer.checkpoint import megatron_fixes
from trainer.checkpoint.format import MEGATRON_LM_FORMAT
from trainer.checkpoint.megatron_lm import bridge_counters, rng_grid, rng_matches, saved_keys
from trainer.mcore_translation import megatron_lm_args
from trainer.state import RngState, RunState


def content_metadata(cfg: RunConfig) -> dict:
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if cfg.optimizer.distributed:
        metadata["distrib_optim_sharding_type"] = cfg.checkpoint.optimizer_format
    return metadata


def model_key(index: int, num_chunks: int) -> str:
    return "model" if num_chunks == 1 else f"model{index}"


def model_sharded_state_dict(model: list[torch.nn.Module], metadata: dict) -> dict:
    """Keys of the bare GPT modules (as Megatron-LM saves them): DDP wrapping adds no prefix."""
    return {
        model_key(i, len(model)): chunk.sharded_state_dict(metadata=metadata)
        for i, chunk in enumerate(unwrap_model(model))
    }


def rng_sharded(rng: RngState | None, world_size: int) -> ShardedObject:
    """This rank's RNG streams as one element of a world-sized sharded object."""
    rank = torch.distributed.get_rank()
    data = None if rng is None else rng.as_dict()
    return ShardedObject("rng_state", data, (world_size,), (rank,), replica_id=0)


def rng_grid_sharded(streams: list | None, grid: tuple[int, ...]) -> ShardedObject:
    """RNG streams in Megatron-LM's layout (`training/checkpointing.py:398-465`): one element
    per PP x TP position, written by the first DP replica (the replicas share their streams);
    Megatron Bridge with experts adds DP to the grid (each rank its own element)."""
    pp = parallel_state.get_pipeline_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_rank()
    dp = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    if len(grid) == 3:
        return ShardedObject("rng_state", streams, grid, (pp, tp, dp), replica_id=0)
    return ShardedObject("rng_state", streams, grid, (pp, tp), replica_id=dp)


def this_grid() -> tuple[int, int, int, int]:
    """(PP, TP, DP x CP, world) of this rank's run, as the RNG layouts are sharded over."""
    return (parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_data_parallel_world_size(with_context_parallel=True),
            torch.distributed.get_world_size())


def megatron_lm_common(session, state: RunState) -> dict:
    """What Megatron-LM's `load_checkpoint` reads from the common state besides the tensors
    (`training/checkpointing.py:1296-1377, 2448-2478, 2617-2621`): its `args` (the run's
    arguments with the consumed samples), the step as `iteration`, the schedule as
    `opt_param_scheduler` and the format version (3.0; below it, its argument check asks for a
    `model_parallel_size` this format has not had since). The schedule's weight-decay span is
    Megatron-LM's (`train_iters` x global batch), which its load compares with its own: weight
    decay is constant here, so the span changes nothing."""
    cfg = session.cfg
    scheduler = dict(session.scheduler.state_dict())
    scheduler["wd_incr_steps"] = cfg.train.train_iters * cfg.train.global_batch_size
    return {"args": megatron_lm_args(cfg, state.step, state.consumed_samples),
            "checkpoint_version": 3.0, "iteration": state.step,
            "opt_param_scheduler": scheduler, "num_floating_point_operations_so_far": 0.0}


def _per_inner_optimizer(optimizer, loaded) -> list:
    """The loaded optimizer dict split as `ChainedOptimizer.load_state_dict` splits it
    (optimizer/optimizer.py:1573-1586): the one's dict, or one per chained optimizer."""
    inners = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    if len(inners) == 1:
        return [(inners[0], loaded)]
    parts = [v for _, v in sorted(loaded.items())] if isinstance(loaded, dict) else list(loaded)
    return list(zip(inners, parts, strict=False))


def zero_step_where_missing(optimizer, loaded) -> None:
    """Before the optimizer loads a save made before the first update
    (`megatron_fixes.optimizer_state_before_first_update`): its zero Adam moments are in
    `loaded`, but not its zero step, since Megatron keeps the common step only when it is
    nonzero (`if step:` in `Float16OptimizerWithFloat16Params.sharded_state_dict`,
    optimizer/optimizer.py:1187, and in `FP32Optimizer`'s, :1376), and torch's Adam refuses
    per-parameter state without a `step` (KeyError in `Adam.__setstate__`). The zero step goes
    in as the `common_step` Megatron's own `load_state_dict` gives every parameter
    (`_restore_common_per_param_step`, :1197-1199 and :1345-1347). The distributed optimizer
    keeps its step in the param groups (step 0 there loads as saved,
    distrib_optimizer.py:1024-1032): nothing to add."""
    for inner, part in _per_inner_optimizer(optimizer, loaded):
        torch_optimizer = getattr(inner, "optimizer", None)
        if not isinstance(part, dict) or not megatron_fixes.keeps_step_per_parameter(
                torch_optimizer):
            continue
        holder = part.get("optimizer", part)  # Float16Optimizer's wraps torch's; FP32's is it
        state = holder.get("state") if isinstance(holder, dict) else None
        if not isinstance(state, dict) or "common_step" in state:
            continue
        per_param = [value for value in state.values() if isinstance(value, dict) and value]
        if per_param and not any("step" in value for value in per_param):
            state["common_step"] = torch.tensor(0.0, dtype=torch.float32)


def sharded_checkpoint(session, state: RunState, metadata: dict) -> dict:
    """Everything a full checkpoint holds, as the sharded dict Megatron saves: the model, the
    optimizer, the scheduler and the run state (the shared part once, each rank's RNG streams
    as a world-sized sharded object). With `checkpoint.format=megatron_lm` also what Megatron-LM
    reads (`megatron_lm_common`), and the RNG streams in its PP x TP layout. Call it under
    `megatron_fixes.parameters_gathered`."""
    sharded = model_sharded_state_dict(session.model, metadata)
    megatron_fixes.optimizer_state_before_first_update(session.optimizer)
    with megatron_fixes.gc_frozen():
        sharded["optimizer"] = session.optimizer.sharded_state_dict(sharded, metadata=metadata)
    sharded["scheduler"] = session.scheduler.state_dict()
    sharded["run_state"] = state.common()
    if session.cfg.checkpoint.format == MEGATRON_LM_FORMAT:
        sharded.update(megatron_lm_common(session, state))
        streams = None if state.rng is None else [state.rng.as_megatron_lm()]
        sharded["rng_state"] = rng_grid_sharded(streams, this_grid()[:2])
    else:
        sharded["rng_state"] = rng_sharded(state.rng, state.world_size)
    return sharded


def rng_template(path: Path) -> ShardedObject | None:
    """The load template of the checkpoint's RNG streams for this rank, in the layout they were
    saved in (this project's per rank, Megatron-LM's per PP x TP position, Bridge's per PP x TP
    x DP); None when this run's grid cannot take them (`megatron_lm.rng_matches`)."""
    grid = rng_grid(saved_keys(path))
    pp, tp, dp, world = this_grid()
    if not rng_matches(grid, pp, tp, dp, world):
        return None
    if len(grid) == 1:
        return rng_sharded(RngState.capture(), world)
    return rng_grid_sharded([RngState.capture().as_megatron_lm()], grid)


def loaded_rng(value) -> RngState:
    """The loaded RNG element as this rank's streams: this project's dict, or Megatron-LM's list
    (one entry, or one per DP rank with `--data-parallel-random-init`)."""
    if isinstance(value, dict):
        return RngState.from_dict(value)
    streams = value[parallel_state.get_data_parallel_rank()] if len(value) > 1 else value[0]
    return RngState.from_megatron_lm(streams)


def loaded_run_state(loaded: dict, path: Path, rng: RngState | None) -> RunState:
    """The run state a checkpoint resumes: this project's own, else one made from what
    Megatron-LM keeps (`iteration`, `args.consumed_train_samples`) or Megatron Bridge does
    (`train_state.pt`): the data continue at the consumed samples, loss tokens count afresh."""
    if "run_state" in loaded:
        return RunState.from_common(loaded["run_state"], rng)
    args = loaded.get("args")
    consumed = (getattr(args, "consumed_train_samples", None) if args is not None
                else bridge_counters(path).get("consumed_train_samples"))
    consumed = int(consumed or 0)
    return RunState(step=int(loaded["iteration"]), consumed_samples=consumed,
                    data={"next_sample": consumed},
                    world_size=torch.distributed.get_world_size(), rng=rng)


def save_strategy(*, cached: bool = False):
    """DP replicas split the writing (Megatron-LM's `--ckpt-fully-parallel-save`): otherwise
    the first replica writes every replicated tensor, e.g. all of a fully_reshardable
    optimizer state, while the others wait (strategies/fully_parallel.py:46-138). `cached`
    keeps the save plan and its distribution across saves of one layout (repeated saves of a
    run: what an asynchronous save uses)."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    return FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy(cached_metadata=cached), dp_group,
        do_cache_distribution=cached)

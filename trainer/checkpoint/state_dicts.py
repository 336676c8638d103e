"""What a checkpoint holds, as the sharded state dicts Megatron's `dist_checkpointing` saves and
loads, and the strategy a save writes them with.

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

import torch
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.utils import unwrap_model

from recipes.config.schema import RunConfig
from trainer.checkpoint import megatron_fixes
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


def sharded_checkpoint(session, state: RunState, metadata: dict) -> dict:
    """Everything a full checkpoint holds, as the sharded dict Megatron saves: the model, the
    optimizer, the scheduler and the run state (the shared part once, each rank's RNG streams
    as a world-sized sharded object). Call it under `megatron_fixes.parameters_gathered`."""
    sharded = model_sharded_state_dict(session.model, metadata)
    with megatron_fixes.gc_frozen():
        sharded["optimizer"] = session.optimizer.sharded_state_dict(sharded, metadata=metadata)
    sharded["scheduler"] = session.scheduler.state_dict()
    sharded["run_state"] = state.common()
    sharded["rng_state"] = rng_sharded(state.rng, state.world_size)
    return sharded


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

"""Megatron's side of a conversion: one process, the model's sharded state dict as the template.

Why a template from the real model: the keys, global shapes, layer/expert offsets and the fused
gate/up and Mamba split factories a checkpoint must hold are exactly what the model's own
`sharded_state_dict` (`GPTModel` or `HybridModel`) produces, so the converter asks the model
(built on the meta device, no memory, as the dry run does) on one rank at TP1 x PP1 x EP1,
where every state-dict name carries global layer and expert numbers.
Because those keys are global (`singleton_local_shards=False`), a checkpoint written here loads
into any layout (`checkpoint.load=<dir> checkpoint.load_model_only=true`: the loading model's own
sharded state dict reshards TP/PP/VPP/EP), and any layout's checkpoint is read back here.
The vocabulary stays padded as the recipe's layout pads it (`make_vocab_size_divisible_by` x TP),
so the embedding's global shape is the one the recipe's ranks expect.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from recipes.config.schema import RunConfig
from trainer.interop.region_reader import Region
from trainer.one_rank import one_process, single_rank  # noqa: F401 (the converters' context)

Template = dict  # state-dict name -> ShardedTensor | ShardedTensorFactory | ShardedObject

# A synchronous `dist_checkpointing.save` goes through `TorchDistSaveShardedStrategy.async_save(
# async_strategy="mcore")`, which logs this once per process through its module's logger
# (megatron/core/dist_checkpointing/strategies/torch.py:745-752, `_logged_mcore_async_deprecation`)
# although nothing here saves asynchronously: every import printed it.
ASYNC_DEPRECATION = "MCore's async save is deprecated"
ASYNC_DEPRECATION_LOGGER = "megatron.core.dist_checkpointing.strategies.torch"


def meta_template(one: RunConfig) -> Template:
    """The TP1 model's sharded state dict, flat by state-dict name, built on the meta device."""
    from plugins.registry import build_plugins
    from trainer.checkpoint.state_dicts import content_metadata
    from trainer.mcore_translation import build_transformer_config
    from trainer.model import build_model_chunks

    plugins = build_plugins(one)
    config = plugins.transformer_config(
        build_transformer_config(one, cpu_initialization=True, meta_device=True)
    )
    with torch.device("meta"):
        (chunk,) = build_model_chunks(one, config, plugins)
    return chunk.sharded_state_dict(metadata=content_metadata(one))


def is_weight(item) -> bool:
    """ShardedTensors and their factories hold weights; ShardedObjects are extra state."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    return isinstance(item, ShardedTensor | ShardedTensorFactory)


def weight_shapes(template: Template) -> dict[str, tuple[int, ...]]:
    """State-dict name -> shape on one rank (the global shape of that layer's tensor)."""
    return {name: tuple(item.data.shape) for name, item in template.items() if is_weight(item)}


def save(template: Template, tensors: dict[str, torch.Tensor], one: RunConfig, path: Path) -> None:
    """Write the template with `tensors` as its data (dtype as given) as a torch_dist checkpoint."""
    from megatron.core import dist_checkpointing

    from trainer.checkpoint.state_dicts import content_metadata

    for name, item in template.items():
        if is_weight(item):
            item.data = tensors[name]
    metadata = content_metadata(one)
    with without_async_deprecation():
        dist_checkpointing.save({"model": template}, str(path), content_metadata=metadata)


def is_async_deprecation(record: logging.LogRecord) -> bool:
    """Megatron's async-save deprecation notice (`ASYNC_DEPRECATION`), by its message."""
    return record.getMessage().startswith(ASYNC_DEPRECATION)


@contextlib.contextmanager
def without_async_deprecation() -> Iterator[None]:
    """Drop that one notice from its logger while the block runs; its other records, and every
    other logger's, still print."""
    logger = logging.getLogger(ASYNC_DEPRECATION_LOGGER)
    logger.addFilter(_keep)
    try:
        yield
    finally:
        logger.removeFilter(_keep)


def _keep(record: logging.LogRecord) -> bool:
    return not is_async_deprecation(record)


def regions(template: Template) -> dict[str, list[Region]]:
    """State-dict name -> the `Region`s of the checkpoint holding it, in row order: one per
    stored shard the TP1 tensor is made of, at the layer (and expert) offsets of the name. A
    plain tensor is one region; a fused gate/up factory two ([gate; up] under one key); the
    Mamba mixer's split factories one per part, each under its own key (`in_proj.weight.z`, ...,
    `ssm/mamba_mixer.py:1418-1485`). Concatenated along rows they give the TP1 tensor."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    found = {}
    for name, item in template.items():
        if not is_weight(item):
            continue
        shards = [item] if isinstance(item, ShardedTensor) else _built(item)
        found[name] = [_region(shard) for shard in shards]
    return found


def _region(shard) -> Region:
    shape = tuple(shard.local_shape)
    prepend = len(shard.global_offset) - len(shape)  # the layer (and expert) axes
    return Region(shard.key, tuple(shard.global_offset), (*(1,) * prepend, *shape))


def _built(factory) -> list:
    built = factory.build()
    return list(built.values()) if isinstance(built, dict) else list(built)

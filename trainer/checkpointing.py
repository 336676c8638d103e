"""Megatron distributed checkpoints (`torch_dist`): save a run, load weights into any layout.

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict -> `dist_checkpointing.save`. Tensors are keyed by global names (layer numbers
include the pipeline offset), so weights saved from one layout load into any other.
Exact optimizer resume (the four distributed-optimizer fixes) attaches here in its own issue.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.utils import unwrap_model

from recipes.schema import RunConfig

STEP_FILE = "step.json"


def content_metadata(cfg: RunConfig) -> dict:
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if cfg.optimizer.distributed:
        metadata["distrib_optim_sharding_type"] = cfg.checkpoint.optimizer_format
    return metadata


def _model_key(index: int, num_chunks: int) -> str:
    return "model" if num_chunks == 1 else f"model{index}"


def model_sharded_state_dict(model: list[torch.nn.Module], metadata: dict) -> dict:
    """Keys of the bare GPT modules (as Megatron-LM saves them): DDP wrapping adds no prefix."""
    return {
        _model_key(i, len(model)): chunk.sharded_state_dict(metadata=metadata)
        for i, chunk in enumerate(unwrap_model(model))
    }


def save_checkpoint(
    directory: Path, cfg: RunConfig, model: list, optimizer, scheduler, step: int
) -> Path:
    """Write model, optimizer and scheduler state after `step` optimizer steps."""
    path = Path(directory) / f"step_{step:07d}"
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    metadata = content_metadata(cfg)
    state = model_sharded_state_dict(model, metadata)
    state["optimizer"] = optimizer.sharded_state_dict(state, metadata=metadata)
    state["scheduler"] = scheduler.state_dict()
    state["step"] = step
    dist_checkpointing.save(state, str(path), content_metadata=metadata)
    if torch.distributed.get_rank() == 0:
        (path / STEP_FILE).write_text(json.dumps({"step": step}))
        (Path(directory) / "latest").write_text(path.name)
    torch.distributed.barrier()
    return path


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A run's checkpoint root (follows its `latest` marker) or one step directory."""
    path = Path(path)
    latest = path / "latest"
    return path / latest.read_text().strip() if latest.exists() else path


def load_model_weights(path: str | Path, model: list) -> None:
    """Load only the weights (any layout) into this rank's model chunks."""
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    template = model_sharded_state_dict(model, metadata)
    loaded = dist_checkpointing.load(template, str(path))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[_model_key(i, len(model))])


def save_model_weights(directory: str | Path, cfg: RunConfig, model: list) -> Path:
    """Weights only (no optimizer): a reference other layouts and runs can start from."""
    path = Path(directory)
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    metadata = content_metadata(cfg)
    dist_checkpointing.save(
        model_sharded_state_dict(model, metadata), str(path), content_metadata=metadata
    )
    torch.distributed.barrier()
    return path

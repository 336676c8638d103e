"""Megatron distributed checkpoints (`torch_dist`): save a run, load weights into any layout.

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict -> `dist_checkpointing.save`. Tensors are keyed by global names (layer numbers
include the pipeline offset), so weights saved from one layout load into any other.
Resuming restores model, optimizer, scheduler and step. Megatron Core 0.19.2 needs four fixes
on the distributed-optimizer load path (measured in shared/notes/megatron-core-on-cpu.md); they
are applied here, around Megatron's own calls, without editing the installed package.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.utils import unwrap_model

from recipes.schema import RunConfig


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


@contextlib.contextmanager
def _parameters_gathered(model: list):
    """With overlapped param all-gather the updated weights arrive in the next forward's
    pre-hook; finish that gather first (as Megatron-LM does) so the saved weights are current."""
    overlapped = [
        chunk for chunk in model
        if chunk.ddp_config.use_distributed_optimizer and chunk.ddp_config.overlap_param_gather
    ]
    for chunk in overlapped:
        chunk.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        for chunk in overlapped:
            chunk.enable_forward_pre_hook()


def save_checkpoint(
    directory: Path, cfg: RunConfig, model: list, optimizer, scheduler, step: int
) -> Path:
    """Write model, optimizer and scheduler state after `step` optimizer steps."""
    path = Path(directory) / f"step_{step:07d}"
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    metadata = content_metadata(cfg)
    with _parameters_gathered(model):
        state = model_sharded_state_dict(model, metadata)
        state["optimizer"] = optimizer.sharded_state_dict(state, metadata=metadata)
        state["scheduler"] = scheduler.state_dict()
        state["step"] = step
        dist_checkpointing.save(state, str(path), content_metadata=metadata)
    if torch.distributed.get_rank() == 0:
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


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _is_distributed(optimizer) -> bool:
    return hasattr(optimizer, "_init_optimizer_states_with_dummy_values")


def _create_state_if_missing(optimizer) -> None:
    """Fix 1: a fresh distributed optimizer has no state to describe (`assert len(steps) == 1`,
    distrib_optimizer.py:839); Megatron's own dummy step creates it (replaced by the load)."""
    for inner in _inner_optimizers(optimizer):
        if _is_distributed(inner) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


@contextlib.contextmanager
def _keep_step_out_of_param_state(optimizer):
    """Fix 2: the per-parameter copy (distrib_optimizer.py:1193) expects a `step` tensor the
    loaded dict lacks (KeyError), or, dp_reshardable, overwrites the right step with the
    receiving optimizer's dummy one. Handing it the parameter's own step makes that a no-op;
    the step itself comes from the param groups, as Megatron's load sets it."""
    patched = []
    for inner in _inner_optimizers(optimizer):
        if not _is_distributed(inner):
            continue
        original = inner._set_main_param_and_optimizer_states

        def without_step(model_param, tensors, _inner=inner, _original=original):
            group_index, group_order = _inner.model_param_group_index_map[model_param]
            main_param = _inner.optimizer.param_groups[group_index]["params"][group_order]
            own_step = _inner.optimizer.state[main_param].get("step")
            if own_step is not None:
                tensors = {**tensors, "step": own_step}
            return _original(model_param, tensors)

        inner._set_main_param_and_optimizer_states = without_step
        patched.append(inner)
    try:
        yield
    finally:
        for inner in patched:
            del inner._set_main_param_and_optimizer_states


def _give_each_param_its_own_step(optimizer) -> None:
    """Fix 4 (silent): the load gives every parameter one shared `step` tensor
    (distrib_optimizer.py:1028); torch's foreach Adam then increments it once per parameter."""
    for inner in _inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for state in torch_optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].detach().clone()


def load_checkpoint(path: str | Path, model: list, optimizer, scheduler) -> int:
    """Restore weights, optimizer and scheduler state; returns the step to continue from."""
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    _create_state_if_missing(optimizer)
    template = model_sharded_state_dict(model, metadata)
    template["optimizer"] = optimizer.sharded_state_dict(
        template, is_loading=True, metadata=metadata
    )
    loaded = dist_checkpointing.load(template, str(path))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[_model_key(i, len(model))])
    # Fix 3: the dp_reshardable loader copies into leaf params without no_grad
    # (distrib_optimizer.py:2061); fp32 then fails with an in-place-on-leaf error.
    with torch.no_grad(), _keep_step_out_of_param_state(optimizer):
        optimizer.load_state_dict(loaded["optimizer"])
    _give_each_param_its_own_step(optimizer)
    scheduler.load_state_dict(loaded["scheduler"])
    return int(loaded["step"])

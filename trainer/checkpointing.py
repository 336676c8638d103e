"""Megatron distributed checkpoints (`torch_dist`): save a run, load weights into any layout.

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict -> `dist_checkpointing.save`. Tensors are keyed by global names (layer numbers
include the pipeline offset), so weights saved from one layout load into any other.
A full checkpoint holds model, optimizer, scheduler and the typed `RunState` (step, consumed
samples and tokens, data position, plugin states; each rank's RNG streams as a sharded object),
so resuming restores all of it. Megatron Core 0.19.2 needs four fixes on the
distributed-optimizer load path; they are applied here, around Megatron's own calls, without
editing the installed package. `docs/checkpoints.md` lists each defect with its file:line.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.utils import unwrap_model

from recipes.config.schema import RunConfig
from trainer.state import RngState, RunState


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


def _rng_sharded(rng: RngState | None, world_size: int) -> ShardedObject:
    """This rank's RNG streams as one element of a world-sized sharded object."""
    rank = torch.distributed.get_rank()
    data = None if rng is None else rng.as_dict()
    return ShardedObject("rng_state", data, (world_size,), (rank,), replica_id=0)


def save_checkpoint(session, directory: str | Path) -> Path:
    """Write model, optimizer, scheduler and the run state after `session.state.step` steps."""
    state: RunState = session.capture_state()
    path = Path(directory) / f"step_{state.step:07d}"
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    metadata = content_metadata(session.cfg)
    with _parameters_gathered(session.model):
        sharded = model_sharded_state_dict(session.model, metadata)
        sharded["optimizer"] = session.optimizer.sharded_state_dict(sharded, metadata=metadata)
        sharded["scheduler"] = session.scheduler.state_dict()
        sharded["run_state"] = state.common()
        sharded["rng_state"] = _rng_sharded(state.rng, state.world_size)
        dist_checkpointing.save(sharded, str(path), content_metadata=metadata)
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


def _saved_world_size(path: Path) -> int:
    """World size of the run that wrote the checkpoint (from its common state)."""
    common = dist_checkpointing.load_common_state_dict(str(path))
    return int(common["run_state"]["world_size"])


def load_checkpoint(session, path: str | Path) -> RunState:
    """Restore weights, optimizer, scheduler and run state; returns the restored `RunState`.

    Each rank's RNG streams come back when the world size is the one that saved them; under
    another layout the ranks keep their freshly seeded streams (nothing to map them onto).
    """
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    model, optimizer = session.model, session.optimizer
    _create_state_if_missing(optimizer)
    template = model_sharded_state_dict(model, metadata)
    template["optimizer"] = optimizer.sharded_state_dict(
        template, is_loading=True, metadata=metadata
    )
    world_size = torch.distributed.get_world_size()
    same_world = _saved_world_size(path) == world_size
    if same_world:
        template["rng_state"] = _rng_sharded(RngState.capture(), world_size)
    loaded = dist_checkpointing.load(template, str(path))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[_model_key(i, len(model))])
    # Fix 3: the dp_reshardable loader copies into leaf params without no_grad
    # (distrib_optimizer.py:2061); fp32 then fails with an in-place-on-leaf error.
    with torch.no_grad(), _keep_step_out_of_param_state(optimizer):
        optimizer.load_state_dict(loaded["optimizer"])
    _give_each_param_its_own_step(optimizer)
    session.scheduler.load_state_dict(loaded["scheduler"])
    rng = RngState.from_dict(loaded["rng_state"]) if same_world else None
    return RunState.from_common(loaded["run_state"], rng)

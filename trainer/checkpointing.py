"""Megatron distributed checkpoints (`torch_dist`): save a run, load weights into any layout.

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict -> `dist_checkpointing.save`. Tensors are keyed by global names (layer numbers
include the pipeline offset), so weights saved from one layout load into any other.
A full checkpoint holds model, optimizer, scheduler and the typed `RunState` (step, consumed
samples and tokens, data position, plugin states; each rank's RNG streams as a sharded object),
so resuming restores all of it; with fp16 the optimizer's part holds the loss scaler's scale,
growth tracker and hysteresis tracker (`grad_scaler` in Megatron's optimizer state dict,
optimizer/optimizer.py:1133-1134 and 1208-1213). Megatron Core 0.19.2 needs four fixes on the
distributed-optimizer load path; they are applied here, around Megatron's own calls, without
editing the installed package. `docs/checkpoints.md` lists each defect with its file:line.

Publication is atomic so that a crash never leaves a half-written checkpoint under a final name:
a save is written to `step_NNNNNNN.tmp-<token>` (one token for all ranks), renamed to
`step_NNNNNNN` by rank 0 once every rank finished, and only then is `latest` replaced (write to
a temporary file, rename). A crash at any point leaves the previous checkpoint or the new one as
the newest complete step, which is what a resume picks (`recipes/config/paths.py`
`newest_checkpoint`). `checkpoint.keep_last` rotation runs after publication and never deletes
the step this run resumed from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.utils import unwrap_model

from recipes.config.paths import (
    LATEST_FILE,
    STEP_PREFIX,
    TMP_INFIX,
    complete_steps,
    is_checkpoint,
    newest_checkpoint,
    step_of,
)
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


def _shared_token(step: int) -> str:
    """A name part unique to this save and identical on every rank (rank 0 draws it)."""
    token = [f"{step}-{uuid.uuid4().hex[:8]}" if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)
    return token[0]


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (cheap; skipped where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, final: Path) -> None:
    """Rank 0: rename the finished save into place, then point `latest` at it."""
    root = final.parent
    if final.exists():  # a re-save of a step (a resume from an earlier one): replace it
        replaced = root / f"{final.name}{TMP_INFIX}replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
        tmp.rename(final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        tmp.rename(final)
    marker = root / f"{LATEST_FILE}{TMP_INFIX}{os.getpid()}"
    with open(marker, "w", encoding="utf-8") as f:
        f.write(final.name)
        f.flush()
        os.fsync(f.fileno())
    marker.replace(root / LATEST_FILE)
    _fsync_dir(root)


def checkpoints_to_delete(
    existing_steps: list[int], keep_last: int | None, resumed_from: int | None
) -> list[int]:
    """The complete steps `checkpoint.keep_last` rotation deletes: all but the newest
    `keep_last`, never `resumed_from` (the step this run loaded); none when `keep_last` is None."""
    if keep_last is None:
        return []
    older = sorted(existing_steps)[:-keep_last]
    return [step for step in older if step != resumed_from]


def _stale_saves(root: Path, newest: int) -> list[Path]:
    """`.tmp-` directories of saves at or before the newest published step (crash leftovers)."""
    stale = []
    for path in root.glob(f"{STEP_PREFIX}*{TMP_INFIX}*"):
        step = step_of(path.name.split(TMP_INFIX)[0])
        if path.is_dir() and step is not None and step <= newest:
            stale.append(path)
    return stale


def _rotate(root: Path, keep_last: int | None, resumed_from: Path | None) -> None:
    """Rank 0, after publication: drop rotated-out steps and leftovers of crashed saves."""
    steps = {step_of(p.name): p for p in complete_steps(root)}
    protected = None
    if resumed_from is not None and resumed_from.parent.resolve() == root.resolve():
        protected = step_of(resumed_from.name)
    for step in checkpoints_to_delete(list(steps), keep_last, protected):
        shutil.rmtree(steps[step], ignore_errors=True)
    for path in _stale_saves(root, max(steps, default=-1)):
        shutil.rmtree(path, ignore_errors=True)


def _write_sharded(session, state: RunState, path: Path) -> None:
    metadata = content_metadata(session.cfg)
    with _parameters_gathered(session.model):
        sharded = model_sharded_state_dict(session.model, metadata)
        sharded["optimizer"] = session.optimizer.sharded_state_dict(sharded, metadata=metadata)
        sharded["scheduler"] = session.scheduler.state_dict()
        sharded["run_state"] = state.common()
        sharded["rng_state"] = _rng_sharded(state.rng, state.world_size)
        dist_checkpointing.save(sharded, str(path), content_metadata=metadata)


def save_checkpoint(session, directory: str | Path) -> Path:
    """Write model, optimizer, scheduler and the run state after `session.state.step` steps,
    and publish it atomically as `<directory>/step_NNNNNNN` (module docstring).

    Call it only between optimizer steps: the run loop (`trainer/loop.py`) saves after
    `train_step` has returned, when gradients are applied and `state.step` counts the step.
    Nothing marks a step in progress, so that is the caller's contract, not checked here.
    """
    state: RunState = session.capture_state()
    root = Path(directory)
    final = root / f"{STEP_PREFIX}{state.step:07d}"
    tmp = root / f"{final.name}{TMP_INFIX}{_shared_token(state.step)}"
    if torch.distributed.get_rank() == 0:
        tmp.mkdir(parents=True)
    torch.distributed.barrier()
    _write_sharded(session, state, tmp)
    torch.distributed.barrier()  # every rank's shards are written
    if torch.distributed.get_rank() == 0:
        _publish(tmp, final)
        _rotate(root, session.cfg.checkpoint.keep_last, session.resumed_from)
    torch.distributed.barrier()
    return final


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """One step directory, or the step a checkpoint root resumes from: the one `latest` names
    when complete, else the newest complete one (`.tmp-` saves ignored). `checkpoint.load` was
    checked before any rank started (`recipes/config/paths.py`); a root without a complete step
    here is a programming error."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    newest = newest_checkpoint(path)
    if newest is None:
        raise FileNotFoundError(f"{path} holds no complete checkpoint")
    return newest


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

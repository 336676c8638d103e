"""Load a checkpoint: the weights alone into any layout, or a whole run to resume.

Loading unpickles no code where torch allows it: non-tensor objects go through the restricted
`weights_only` unpickler (`megatron_fixes.weights_only_objects`); only torch DCP's own
`.metadata` index is a plain pickle (docs/checkpoints.md, "Untrusted checkpoints"). A resume
takes this run's learning rates and Adam settings and its schedule, with the position (samples
consumed) from the save. Megatron Core 0.19.2 needs fixes on the distributed-optimizer load
path; they are `megatron_fixes` entries, applied here around Megatron's own calls.
"""

from __future__ import annotations

from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint.api import CheckpointException

from recipes.config.schema import RunConfig
from trainer.checkpoint import fsdp_dtensor, megatron_fixes, state_dicts
from trainer.checkpoint.format import (
    FSDP_DTENSOR,
    checkpoint_backend,
    is_checkpoint,
    newest_checkpoint,
)
from trainer.checkpoint.megatron_fixes import UntrustedCheckpointError
from trainer.state import RngState, RunState

__all__ = ["UntrustedCheckpointError", "load_checkpoint", "load_fsdp_weights",
           "load_model_weights", "resolve_checkpoint_dir", "saved_as_fsdp_dtensor"]


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """One step directory, or the step a checkpoint root resumes from: the one `latest` names
    when complete, else the newest complete one (`.tmp-` saves ignored). `checkpoint.load` was
    checked before any rank started (`preflight.py`); a root without a complete step here is a
    programming error."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    newest = newest_checkpoint(path)
    if newest is None:
        raise FileNotFoundError(f"{path} holds no complete checkpoint")
    return newest


def _load(template: dict, path: Path) -> dict:
    """`dist_checkpointing.load` with weights-only objects; a refused object is raised as the
    one-line `UntrustedCheckpointError`, not inside torch's `CheckpointException` report."""
    try:
        with megatron_fixes.weights_only_objects():
            return dist_checkpointing.load(template, str(path))
    except CheckpointException as failure:
        for wrapped in failure.failures.values():
            error = wrapped[0] if isinstance(wrapped, tuple) else wrapped
            if isinstance(error, UntrustedCheckpointError):
                raise error from None
        raise


def saved_as_fsdp_dtensor(path: str | Path) -> bool:
    """Whether the checkpoint `path` names (or resumes from) is Megatron FSDP's `fsdp_dtensor`:
    its weights load into Megatron FSDP's chunks once wrapped (`load_fsdp_weights`), the
    others' into the bare chunks before wrapping (`load_model_weights`)."""
    return checkpoint_backend(resolve_checkpoint_dir(path)) == FSDP_DTENSOR


def load_fsdp_weights(cfg: RunConfig, path: str | Path, model: list) -> None:
    """Only the weights of an `fsdp_dtensor` checkpoint into this rank's Megatron FSDP chunks."""
    fsdp_dtensor.load_weights(cfg, resolve_checkpoint_dir(path), model)


def load_model_weights(path: str | Path, model: list) -> None:
    """Load only the weights (any layout) of a `torch_dist` checkpoint into this rank's model
    chunks (unwrapped)."""
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    template = state_dicts.model_sharded_state_dict(model, metadata)
    loaded = _load(template, path)
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[state_dicts.model_key(i, len(model))])


def _this_runs_hyperparameters(cfg: RunConfig) -> dict:
    o = cfg.optimizer
    return {"max_lr": o.lr, "min_lr": o.min_lr, "betas": (o.adam_beta1, o.adam_beta2),
            "eps": o.adam_eps}


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
    if checkpoint_backend(path) == FSDP_DTENSOR:
        return fsdp_dtensor.load(session, path, _this_runs_hyperparameters(session.cfg))
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    model, optimizer = session.model, session.optimizer
    megatron_fixes.create_state_if_missing(optimizer)
    template = state_dicts.model_sharded_state_dict(model, metadata)
    with megatron_fixes.gc_frozen():
        template["optimizer"] = optimizer.sharded_state_dict(
            template, is_loading=True, metadata=metadata
        )
    world_size = torch.distributed.get_world_size()
    same_world = _saved_world_size(path) == world_size
    if same_world:
        template["rng_state"] = state_dicts.rng_sharded(RngState.capture(), world_size)
    loaded = _load(template, path)
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[state_dicts.model_key(i, len(model))])
    megatron_fixes.adopt_hyperparameters(loaded["optimizer"],
                                         _this_runs_hyperparameters(session.cfg))
    with megatron_fixes.load_without_grad(), \
            megatron_fixes.keep_step_out_of_param_state(optimizer):
        optimizer.load_state_dict(loaded["optimizer"])
    megatron_fixes.give_each_param_its_own_step(optimizer)
    session.scheduler.load_state_dict(loaded["scheduler"])
    rng = RngState.from_dict(loaded["rng_state"]) if same_world else None
    return RunState.from_common(loaded["run_state"], rng)

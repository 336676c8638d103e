"""Load a checkpoint: the weights alone into any layout, or a whole run to resume.

Loading unpickles no code where torch allows it: non-tensor objects go through the restricted
`weights_only` unpickler (`megatron_fixes.weights_only_objects`); only torch DCP's own
`.metadata` index is a plain pickle (docs/checkpoints.md, "Untrusted checkpoints"). A resume
takes this run's learning rates and Adam settings and its schedule, with the position (samples
consumed) from the save. Megatron Core 0.19.2 needs fixes on the distributed-optimizer load
path; they are `megatron_fixes` entries, applied here around Megatron's own calls. A step
Megatron-LM or Megatron Bridge wrote (`format.py`'s second layout) loads through the same calls:
its tensors are the same; only its common state and RNG layout differ (`state_dicts.py`).
"""

from __future__ import annotations

from pathlib import Path

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
from trainer.state import RunState

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


def _scheduler_state(loaded: dict) -> dict:
    """The schedule's position: this project's `scheduler`, else Megatron-LM's (and Megatron
    Bridge's) `opt_param_scheduler`, the same state under another key."""
    return loaded["scheduler"] if "scheduler" in loaded else loaded["opt_param_scheduler"]


def load_checkpoint(session, path: str | Path) -> RunState:
    """Restore weights, optimizer, scheduler and run state; returns the restored `RunState`.
    A step Megatron-LM or Megatron Bridge wrote resumes the same way: the same tensors, its
    schedule, its step and consumed samples (`state_dicts.loaded_run_state`).

    Each rank's RNG streams come back when this run's grid is the one they were saved over
    (this project's: the same world size; Megatron-LM's: the same PP x TP); otherwise the
    ranks keep their freshly seeded streams (nothing to map them onto), as the pre-flight said.
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
    rng_template = state_dicts.rng_template(path)
    if rng_template is not None:
        template["rng_state"] = rng_template
    loaded = _load(template, path)
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[state_dicts.model_key(i, len(model))])
    megatron_fixes.adopt_hyperparameters(loaded["optimizer"],
                                         _this_runs_hyperparameters(session.cfg))
    state_dicts.zero_step_where_missing(optimizer, loaded["optimizer"])
    with megatron_fixes.load_without_grad(), \
            megatron_fixes.keep_step_out_of_param_state(optimizer):
        optimizer.load_state_dict(loaded["optimizer"])
    megatron_fixes.give_each_param_its_own_step(optimizer)
    session.scheduler.load_state_dict(_scheduler_state(loaded))
    rng = state_dicts.loaded_rng(loaded["rng_state"]) if rng_template is not None else None
    return state_dicts.loaded_run_state(loaded, path, rng)

"""Per-rank functions for tests/dist/test_fsdp_empty_rank.py (through `launch_ranks`): a
Megatron FSDP run in which one rank holds no shard of a whole bucket, saved and resumed.

`continuous` trains, and before its one save reports what this rank holds of each parameter
(from Megatron FSDP's own buffer) and which DTensors its fsdp_dtensor state dict would list
without `megatron_fixes.empty_shard_optimizer_state`; the resume is `resume_runs.resumed`.
"""

from __future__ import annotations

from pathlib import Path

from tests.dist.fsdp_runs import _dtensor_keys
from tests.dist.layout_runs import _finish, _session
from tests.dist.resume_runs import _train


def _local_sizes(session) -> dict[str, int]:
    """Each parameter's elements in this rank's shard, by its name in the model."""
    sizes = {}
    for chunk in session.model:
        buffer = chunk.module.param_and_grad_buffer  # the adapter's MegatronFSDP
        for name, param in buffer.optimizer_named_parameters:
            sizes[name] = param.to_local().numel()
    return sizes


def _listed_without_fix(session) -> list[str]:
    from trainer.checkpoint import fsdp_dtensor, megatron_fixes

    with megatron_fixes.skipping({"empty_shard_optimizer_state"}):
        return sorted(_dtensor_keys(fsdp_dtensor._state_dict(session, loading=False)))


def continuous(payload: dict) -> dict:
    """`steps` steps, saved after `save_at` (synchronously); before the save, this rank's
    shard sizes and the DTensors it would list without the fix."""
    from trainer.checkpoint.save import save_checkpoint

    session = _session(payload)
    records = _train(session, payload["save_at"])
    sizes, unfixed = _local_sizes(session), _listed_without_fix(session)
    save_checkpoint(session, Path(payload["checkpoint_dir"]))
    records += _train(session, payload["steps"])
    _finish()
    return {"records": records, "sizes": sizes, "unfixed": unfixed}

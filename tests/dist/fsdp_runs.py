"""Per-rank functions for the Megatron FSDP and offload tests (through `launch_ranks`).

`state_dict_tensors` is the self-test of `megatron_fixes.empty_shard_optimizer_state`: which
DTensors each rank puts in its fsdp_dtensor state dict after a step, with the fix or without
it (every rank must list the same ones: the uneven-DTensor metadata is gathered tensor by
tensor in sorted key order, so different lists pair different tensors' collectives and the
save hangs).
"""

from __future__ import annotations

from tests.dist.layout_runs import _finish, _session


def _dtensor_keys(tree: dict, prefix: str = "") -> list[str]:
    from torch.distributed.tensor import DTensor

    keys = []
    for key, value in tree.items():
        if isinstance(value, dict):
            keys += _dtensor_keys(value, f"{prefix}{key}.")
        elif isinstance(value, DTensor):
            keys.append(f"{prefix}{key}")
    return keys


def state_dict_tensors(payload: dict) -> dict:
    """After one step: the DTensors of this rank's fsdp_dtensor state dict, with every fix
    (`fixed`) and without `empty_shard_optimizer_state` (`unfixed`, a fresh session)."""
    from trainer.checkpoint import fsdp_dtensor, megatron_fixes
    from trainer.step import train_step

    listed = {}
    for name, skipped in (("unfixed", {"empty_shard_optimizer_state"}), ("fixed", set())):
        session = _session(payload)
        train_step(session)
        with megatron_fixes.skipping(skipped):
            state = fsdp_dtensor._state_dict(session, loading=False)
        listed[name] = sorted(_dtensor_keys(state))
        _finish()
    return listed

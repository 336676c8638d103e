"""Per-rank functions for the Megatron FSDP and offload tests (through `launch_ranks`).

`state_dict_tensors` is the self-test of `megatron_fixes.empty_shard_optimizer_state`: which
DTensors each rank puts in its fsdp_dtensor state dict after a step, with the fix or without
it (every rank must list the same ones: the uneven-DTensor metadata is gathered tensor by
tensor in sorted key order, so different lists pair different tensors' collectives and the
save hangs). `swiglu_optimizer_state` is the self-test of `megatron_fixes.swiglu_optimizer_keys`:
a SwiGLU model's fsdp_dtensor state dict after a step, prepared with the fix or without it.
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


def swiglu_optimizer_state(payload: dict) -> dict:
    """After one step of a SwiGLU model: the fc1 optimizer keys of the prepared fsdp_dtensor
    state dict (its two halves), and what preparing it without `swiglu_optimizer_keys` raises."""
    from trainer.checkpoint import fsdp_dtensor, megatron_fixes
    from trainer.step import train_step

    session = _session(payload)
    train_step(session)
    found = {}
    for name, skipped in (("unfixed", {"swiglu_optimizer_keys"}), ("fixed", set())):
        with megatron_fixes.skipping(skipped):
            try:
                state = fsdp_dtensor._prepared(session.cfg, session.model,
                                               fsdp_dtensor._state_dict(session, loading=False))
                found[name] = sorted(key for key in state["optimizer"]["state"]
                                     if "linear_fc1" in key)
            except AttributeError as error:
                found[name] = f"AttributeError: {error}"
    _finish()
    return found


def _an_unfinished_gather_is_seen(check) -> bool:
    """The check's self-test: rank 1 joins an all-gather only once rank 0 has asked whether its
    output is in use (told through the default store), so rank 0's half cannot have finished
    by then (it is in use; nothing is freed)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    rank, store, asked = dist.get_rank(), _get_default_store(), "bucket-free-self-test/asked"
    if rank == 1:
        store.wait([asked])
    output = torch.zeros(2 * 64)
    with check.module._coalescing_manager(None, async_ops=True) as started:
        dist.all_gather_into_tensor(output, torch.full((64,), float(rank)))
    seen = bool(check.in_use(output))
    if rank == 0:
        store.set(asked, "1")
    started.wait()
    return seen


def bucket_frees(payload: dict) -> dict:
    """`payload['steps']` steps of a Megatron FSDP run under `BucketFreeCheck`: how many buckets
    were freed, how many of those frees came with a parameter all-gather still unfinished, and
    each free of a storage such an all-gather used; then the check's self-test."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer

    from tests.dist.bucket_free_check import BucketFreeCheck
    from trainer.step import train_step

    session = _session(payload)
    with BucketFreeCheck(param_and_grad_buffer) as check:
        for _ in range(payload["steps"]):
            train_step(session)
        figures = check.figures()
        figures["self_test_seen"] = _an_unfinished_gather_is_seen(check)
    _finish()
    return figures

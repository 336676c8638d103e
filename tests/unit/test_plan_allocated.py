"""The planner's model-state bytes equal what the trainer really allocates on a rank.

Each case is measured by `tests/unit/allocated_probe.py` in a process of its own (forked from one
interpreter that imported torch once, tests/forked.py): it builds the model exactly as the
trainer does and measures weights, the DDP gradient buffers, FP32 master weights and Adam moments
from the tensors. Every precision and the distributed optimizer on one rank; then each Megatron
FSDP level and optimizer CPU offload on two ranks of one gloo group, where each rank holds a
share: the planner's figure is the share of a DP rank, so it equals the mean of the two ranks'
parameter bytes exactly; Megatron FSDP's buffers also pad each parameter group to a multiple of
DP x its row size, measured beside it (`ALIGNMENT_SHARE`).
"""

from __future__ import annotations

import pytest

from recipes.plan.memory import offload_share, rank_model_state, sharding_of, state_bytes_of
from recipes.plan.params import stage_params
from recipes.resolve import resolve_config
from tests.forked import run_forked

CASES = [
    ["recipe=tiny_dp1"],
    ["recipe=tiny_dp1", "precision.dtype=bf16"],
    ["recipe=tiny_dp1", "precision.dtype=bf16", "precision.grad_reduce_in_fp32=false"],
    ["recipe=tiny_dp1", "precision.dtype=bf16", "optimizer.distributed=true"],
    ["recipe=tiny_dp1", "precision.dtype=fp16"],
    ["recipe=mixtral_tiny_ep1", "precision.dtype=bf16"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_model_state_equals_allocated_bytes(measured, args):
    (real,) = measured[" ".join(args)]
    cfg = resolve_config(args)
    plan = rank_model_state(cfg, stage_params(cfg)[0], state_bytes_of(cfg), sharding_of(cfg))
    assert real == {"weights": plan.weights, "grads": plan.grads, "master": plan.master,
                    "moments": plan.moments}


# Megatron FSDP pads each parameter group to a multiple of DP x its row size
# (param_and_grad_buffer.py:253-287); on the tiny model that stays under this share of the
# planned model state (ZeRO-3's per-layer groups pad the most).
ALIGNMENT_SHARE = 0.01
SHARDED_CASES = [
    ["recipe=tiny_dp2_distopt", "optimizer.fsdp=optim"],
    ["recipe=tiny_dp2_distopt", "optimizer.fsdp=optim_grads"],
    ["recipe=tiny_dp2_fsdp"],
    ["recipe=tiny_dp2_fsdp", "precision.dtype=bf16"],
    ["recipe=tiny_dp2_fsdp", "precision.dtype=bf16", "precision.grad_reduce_in_fp32=false"],
    ["recipe=tiny_dp2_bf16_offload"],
    ["recipe=tiny_dp2_bf16_offload", "optimizer.offload_fraction=0.5"],
]


@pytest.fixture(scope="module")
def measured() -> dict[str, list[dict]]:
    """Every case's per-rank measurement, by its arguments joined: the single-rank cases on one
    rank, the sharded ones on two."""
    runs = {" ".join(args): [args, 1] for args in CASES}
    runs |= {" ".join(args): [args, 2] for args in SHARDED_CASES}
    return run_forked("tests.unit.allocated_probe:print_measured", runs)


@pytest.mark.parametrize("args", SHARDED_CASES, ids=[" ".join(c) for c in SHARDED_CASES])
def test_sharded_model_state_equals_what_each_rank_holds(measured, args):
    """Each item: the planned bytes are the mean of the two ranks' parameter bytes, exactly;
    each rank's buffer holds at most the alignment padding beyond them."""
    ranks = measured[" ".join(args)]
    cfg = resolve_config(args)
    plan = rank_model_state(cfg, stage_params(cfg)[0], state_bytes_of(cfg), sharding_of(cfg),
                            offload_share(cfg))
    planned = {"weights": plan.weights, "grads": plan.grads, "master": plan.master,
               "moments": plan.moments, "offloaded": plan.offloaded}
    fraction = cfg.optimizer.offload_fraction if cfg.optimizer.cpu_offload else 0.0
    for item, bytes_planned in planned.items():
        held = [rank.get(item, [0, 0]) for rank in ranks]
        mean = sum(params for _, params in held) / len(held)
        if 0.0 < fraction < 1.0 and item in ("master", "moments", "offloaded"):
            continue  # whole parameters go to one side: the split is checked below
        assert mean == bytes_planned, (item, held, bytes_planned)
        for padded, params in held:
            assert params <= padded <= params + ALIGNMENT_SHARE * plan.total, (item, held)
    if 0.0 < fraction < 1.0:
        # The hybrid-device optimizer offloads whole parameters until the share is reached
        # (hybrid_optimizer.py:272-276): device and host together hold the planned state.
        per = state_bytes_of(cfg)
        on_device, on_host = per.master + per.moments, per.master + per.moments + 4
        device = sum(r["master"][1] + r["moments"][1] for r in ranks) / len(ranks) / on_device
        host = sum(r["offloaded"][1] for r in ranks) / len(ranks) / on_host
        assert device + host == stage_params(cfg)[0].dense / cfg.layout.data_parallel
        assert host * on_host >= plan.offloaded and device * on_device <= (
            plan.master + plan.moments)

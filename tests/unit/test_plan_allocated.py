"""The planner's model-state bytes equal what the trainer really allocates on a rank.

A subprocess starts a one-rank gloo group, builds the model exactly as the trainer does
(`build_model_chunks`, the precision wrapper, Megatron DDP, `get_megatron_optimizer`), creates
the Adam state Megatron would create on the first step, and measures from the tensors: weights,
the DDP gradient buffers, FP32 master weights and Adam moments. Every precision and the
distributed optimizer on one rank; then each Megatron FSDP level and optimizer CPU offload on
two ranks (two such subprocesses in one gloo group), where each rank holds a share: the
planner's figure is the share of a DP rank, so it equals the mean of the two ranks' parameter
bytes exactly; Megatron FSDP's buffers also pad each parameter group to a multiple of DP x its
row size, measured beside it (`ALIGNMENT_SHARE`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.plan.memory import offload_share, rank_model_state, sharding_of, state_bytes_of
from recipes.plan.params import stage_params
from recipes.resolve import resolve_config
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]

PROBE = r'''
import json, sys, tempfile
import torch
from megatron.core import parallel_state
from megatron.core.optimizer import get_megatron_optimizer
from plugins.registry import build_plugins
from recipes.resolve import resolve_config
from trainer.mcore_translation import (build_ddp_config, build_optimizer_config,
                                       build_transformer_config, initialize_parallel_state)
from trainer.cpu_runtime.runtime import runtime_for
from trainer.model import build_model_chunks, wrap_for_precision, wrap_with_ddp

def size(t):
    return t.numel() * t.element_size()

def measure(args, rank=0, world=1, init=None):
    cfg = resolve_config(args)
    plugins = build_plugins(cfg)
    plugins.setup_runtime(runtime_for(cfg.cluster))
    init = init or tempfile.mktemp()
    torch.distributed.init_process_group("gloo", init_method="file://" + init, rank=rank,
                                         world_size=world)
    initialize_parallel_state(cfg.layout)
    try:
        config = plugins.transformer_config(build_transformer_config(cfg, cpu_initialization=True))
        chunks = build_model_chunks(cfg, config, plugins)
        model = wrap_with_ddp(wrap_for_precision(chunks, config), config, build_ddp_config(cfg))
        optimizer = get_megatron_optimizer(build_optimizer_config(cfg), model)
        inner = getattr(optimizer, "chained_optimizers", [optimizer])
        if cfg.optimizer.fsdp != "none":
            return fsdp_state(model, inner)
        if cfg.optimizer.cpu_offload:
            return offload_state(model, inner)
        for o in inner:
            o.init_state_fn(o.optimizer, o.config)
        buffers = [b for m in model for b in m.buffers + m.expert_parallel_buffers]
        master = [p for o in inner for g in (getattr(o, "shard_fp32_from_float16_groups", None)
                  or getattr(o, "fp32_from_float16_groups", None) or []) for p in g]
        return {
            "weights": sum(size(p) for m in model for p in m.module.parameters()),
            "grads": sum(size(b.grad_data) for b in buffers),
            "master": sum(size(p) for p in master),
            "moments": sum(size(v) for o in inner for state in o.optimizer.state.values()
                           for v in state.values() if torch.is_tensor(v) and v.dim() > 0),
        }
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()

def held(buffer):
    """(padded bytes of this rank's buffer, bytes of parameter elements in it)."""
    if buffer is None or buffer.data is None:
        return 0, 0
    items = sum(buffer.get_item(i, only_shard=buffer.is_data_distributed).numel()
                for i in range(len(buffer.params)))
    return size(buffer.data), items * buffer.data.element_size()

def fsdp_state(model, inner):
    # Megatron FSDP's buffers per parameter group (distributed/fsdp/src/megatron_fsdp/
    # param_and_grad_buffer.py:2317-2700); the Adam state of its DTensor main weights.
    for o in inner:
        o._init_optimizer_states_with_dummy_values()
    found = {key: [0, 0] for key in ("weights", "grads", "master")}
    for m in model:
        for group in m.param_and_grad_buffer.parameter_groups:
            for key, name in (("weights", "model_weight_buffer"), ("grads", "main_grad_buffer"),
                              ("master", "main_weight_buffer")):
                padded, params = held(getattr(group, name))
                found[key][0] += padded
                found[key][1] += params
    moments = sum(size(v.to_local() if hasattr(v, "to_local") else v) for o in inner
                  for state in o.optimizer.state.values() for v in state.values()
                  if torch.is_tensor(v) and v.dim() > 0)
    found["moments"] = [moments, moments]
    return found

def offload_state(model, inner):
    # The hybrid-device optimizer inside the distributed optimizer (optimizer/cpu_offloading/
    # hybrid_optimizer.py): its device side keeps FP32 copies and moments of what it does not
    # offload; its CPU side FP32 copies, moments and an FP32 copy of each gradient.
    for o in inner:
        o.optimizer.dummy_step()
    hybrid = [o.optimizer for o in inner]
    device = [h.gpu_optimizer for h in hybrid if h.gpu_optimizer is not None]
    host = [c for h in hybrid for c in h.cpu_optimizers]
    def params(optimizers):
        return sum(size(p) for o in optimizers for g in o.param_groups for p in g["params"])
    def moments(optimizers):
        # each tensor once: the optimizer's state also names the FP32 copy (`master_param`,
        # hybrid_optimizer.py:323-325), which `params` counts
        kept = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
        found = {id(v): v for o in optimizers for state in o.state.values()
                 for v in state.values() if torch.is_tensor(v) and v.dim() > 0}
        return sum(size(v) for key, v in found.items() if key not in kept)
    buffers = [b for m in model for b in m.buffers + m.expert_parallel_buffers]
    grads = sum(size(b.grad_data) for b in buffers)
    grad_params = sum(p.numel() * b.grad_data.element_size() for b in buffers
                      for p in b.params)
    weights = sum(size(p) for m in model for p in m.module.parameters())
    offloaded = params(host) + moments(host) + sum(size(t) for h in hybrid
                                                   for t in h.cpu_copy_map_grad.values())
    return {"weights": [weights, weights], "grads": [grads, grad_params],
            "master": [params(device)] * 2, "moments": [moments(device)] * 2,
            "offloaded": [offloaded, offloaded]}

if len(sys.argv) > 1 and sys.argv[1].startswith("--rank="):
    rank, world, init = int(sys.argv[1][7:]), int(sys.argv[2][8:]), sys.argv[3][7:]
    print(json.dumps(measure(sys.argv[4:], rank, world, init)))
else:
    print(json.dumps(measure(sys.argv[1:])))
'''

CASES = [
    ["recipe=tiny_dp1"],
    ["recipe=tiny_dp1", "precision.dtype=bf16"],
    ["recipe=tiny_dp1", "precision.dtype=bf16", "precision.grad_reduce_in_fp32=false"],
    ["recipe=tiny_dp1", "precision.dtype=bf16", "optimizer.distributed=true"],
    ["recipe=tiny_dp1", "precision.dtype=fp16"],
    ["recipe=mixtral_tiny_ep1", "precision.dtype=bf16"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_model_state_equals_allocated_bytes(args):
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO,
        timeout=HANG_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                          "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    real = json.loads(result.stdout.splitlines()[-1])
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


def _measure_ranks(args: list[str], tmp_path, world: int = 2) -> list[dict]:
    """The probe on `world` ranks of one gloo group, one subprocess each."""
    init = tmp_path / "init"
    started = [subprocess.Popen(
        [sys.executable, "-c", PROBE, f"--rank={rank}", f"--world={world}", f"--init={init}",
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        for rank in range(world)]
    results = []
    for process in started:
        out, err = process.communicate(timeout=HANG_S)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    return results


@pytest.mark.parametrize("args", SHARDED_CASES, ids=[" ".join(c) for c in SHARDED_CASES])
def test_sharded_model_state_equals_what_each_rank_holds(args, tmp_path):
    """Each item: the planned bytes are the mean of the two ranks' parameter bytes, exactly;
    each rank's buffer holds at most the alignment padding beyond them."""
    ranks = _measure_ranks(args, tmp_path)
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

"""The planner's model-state bytes equal what the trainer really allocates on one rank.

A subprocess starts a one-rank gloo group, builds the model exactly as the trainer does
(`build_model_chunks`, the precision wrapper, Megatron DDP, `get_megatron_optimizer`), creates
the Adam state Megatron would create on the first step, and measures from the tensors: weights,
the DDP gradient buffers, FP32 master weights and Adam moments. Multi-rank layouts need real
ranks (the distributed tier); this covers every precision and sharding setting on one rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.plan.memory import rank_model_state, sharding_of, state_bytes_of
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

def measure(args):
    cfg = resolve_config(args)
    plugins = build_plugins(cfg)
    plugins.setup_runtime(runtime_for(cfg.cluster))
    torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
                                         rank=0, world_size=1)
    initialize_parallel_state(cfg.layout)
    try:
        config = plugins.transformer_config(build_transformer_config(cfg, cpu_initialization=True))
        chunks = build_model_chunks(cfg, config, plugins)
        model = wrap_with_ddp(wrap_for_precision(chunks, config), config, build_ddp_config(cfg))
        optimizer = get_megatron_optimizer(build_optimizer_config(cfg), model)
        inner = getattr(optimizer, "chained_optimizers", [optimizer])
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

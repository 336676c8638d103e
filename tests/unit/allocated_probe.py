"""Subprocess body of tests/unit/test_plan_allocated.py: the model state a rank really allocates.

A rank starts a gloo group, builds the model exactly as the trainer does (`build_model_chunks`,
the precision wrapper, Megatron DDP, `get_megatron_optimizer`), creates the Adam state Megatron
would create on the first step, and measures it from the tensors: weights, the DDP gradient
buffers, FP32 master weights and Adam moments; under Megatron FSDP each parameter group's
buffers, under the hybrid-device optimizer its device and host sides. It runs forked from one
interpreter (tests/forked.py): the CPU runtime's patches and the process group are process-wide.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from megatron.core import parallel_state
from megatron.core.optimizer import get_megatron_optimizer

from plugins.registry import build_plugins
from recipes.resolve import resolve_config
from trainer.cpu_runtime.runtime import runtime_for
from trainer.mcore_translation import (
    build_ddp_config,
    build_optimizer_config,
    build_transformer_config,
    initialize_parallel_state,
)
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


def print_measured(args: list[str], world: int) -> None:
    """Print, as one JSON line, each rank's measurement of the run `args` on `world` ranks of
    one gloo group (this process is rank 0; the others are forked from it before it measures)."""
    folder = Path(tempfile.mkdtemp())
    init = str(folder / "init")
    children = []
    for rank in range(1, world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                (folder / f"rank{rank}.json").write_text(
                    json.dumps(measure(args, rank, world, init)))
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    found = [measure(args, 0, world, init)]
    for rank, pid in enumerate(children, start=1):
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(f"rank {rank} of {args} failed (wait status {status})")
        found.append(json.loads((folder / f"rank{rank}.json").read_text()))
    print(json.dumps(found))

"""Megatron's hybrid-device optimizer (`optimizer.cpu_offload`) on CPU ranks.

`HybridDeviceOptimizer` splits the parameters it is given by `param.is_cuda`: the first
`offload_fraction` of the GPU-resident ones get a CPU copy stepped by a CPU Adam, the rest stay
with the device Adam, and a parameter that is not on the GPU is assumed to be a CPU copy it made
itself (`optimizer/cpu_offloading/hybrid_optimizer.py:251-300`). On a CPU rank no parameter is
`is_cuda`, so nothing is offloaded and the first step fails looking up a copy that was never
made (`_set_sub_optimizer_grads`, :101, `KeyError`). Here the split asks whether a parameter
sits on the rank's compute device instead (on a CPU rank: every parameter the model holds), so
the offloaded share gets its copy, its own CPU optimizer, the gradient copy and the copy back
after the step: Megatron's code path, run where both "devices" are the CPU.
"""

from __future__ import annotations

import torch

_original = None


def _sub_optimizer_param_groups(self, offload_fraction: float):
    """`HybridDeviceOptimizer._get_sub_optimizer_param_groups` (hybrid_optimizer.py:251-300)
    with `param.is_cuda` read as "on the compute device": every parameter handed to the
    optimizer, which on a CPU rank lives in CPU memory; the offloaded copies are made here and
    are the only ones the CPU sub-optimizers step."""
    params = [param for group in self.param_groups for param in group["params"]]
    offload_threshold = sum(param.numel() for param in params) * offload_fraction
    offloaded = 0
    cpu_groups, device_groups = [], []
    device_to_copy, copy_to_device, to_fp32 = {}, {}, {}
    for group in self.param_groups:
        device_group, cpu_group = {**group, "params": []}, {**group, "params": []}
        for original in group["params"]:
            param, copied = original, offloaded < offload_threshold
            if copied:
                param = param.detach().clone()
                offloaded += param.numel()
            if self.param_update_in_fp32 and param.dtype != torch.float32:
                param = param.detach().clone().float()
                to_fp32[original] = param
            if copied:
                device_to_copy[original] = param
                copy_to_device[param] = original
                cpu_group["params"].append(param)
            else:
                device_group["params"].append(param)
        if device_group["params"]:
            device_groups.append(device_group)
        if cpu_group["params"]:
            cpu_groups.append(cpu_group)
    return cpu_groups, device_groups, device_to_copy, copy_to_device, to_fp32


def install_offload_split() -> None:
    """Make `HybridDeviceOptimizer` split a CPU rank's parameters by the offload fraction."""
    global _original
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    if _original is None:
        _original = HybridDeviceOptimizer._get_sub_optimizer_param_groups
        HybridDeviceOptimizer._get_sub_optimizer_param_groups = _sub_optimizer_param_groups

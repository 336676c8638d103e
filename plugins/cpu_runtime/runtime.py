"""CPU runtime plugin: runs unmodified Megatron Core over gloo when there is no CUDA device.

Every fix is a runtime patch; nothing in site-packages is edited. Each patch has a name in
`PATCH_NAMES`, and `activate_cpu_runtime(..., skip=...)` can leave any of them out, so the
self-tests can show what breaks without it. `docs/cpu-runtime.md` says what each patch does and
why; the comments next to each installer cite the Megatron file and line.

Activation is process-wide and idempotent. The device mode lives on torch's mode stack, which
is per thread: activate from the thread that will build and train the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plugins.cpu_runtime.collectives import install_list_split_sizes, install_uneven_all_gather
from plugins.cpu_runtime.cuda_api import disable_dynamo, install_cpu_rng, install_cuda_stand_ins
from plugins.cpu_runtime.device_mode import CudaToCpuMode
from plugins.cpu_runtime.norm import SequenceParallelTorchNorm, adapt_local_layer_spec

__all__ = [
    "PATCH_NAMES",
    "SequenceParallelTorchNorm",
    "activate_cpu_runtime",
    "adapt_local_layer_spec",
    "cpu_runtime_active",
]

# Patches carried out by the one process-wide TorchFunctionMode (see device_mode.py).
_MODE_PATCHES = ("device_redirect", "cuda_type_names", "backward_in_mode")

def install_thd_partition() -> None:
    """TE's per-document CP partition for Megatron's packed CP split (`cp_attention.py`)."""
    from plugins.cpu_runtime.cp_attention import install_thd_partition as install

    install()


def install_mamba_kernels() -> None:
    """The torch Mamba2 kernels in Megatron's Mamba mixer (`mamba_kernels.py`)."""
    from plugins.cpu_runtime.mamba_kernels import install_mamba_kernels as install

    install()


# Patches that are one installer each, in the order they are applied.
_INSTALLERS: dict[str, Callable[[], None]] = {
    "cuda_stand_ins": install_cuda_stand_ins,
    "rng": install_cpu_rng,
    "eager": disable_dynamo,
    "gloo_uneven_all_gather": install_uneven_all_gather,
    "all_to_all_list_splits": install_list_split_sizes,
    "thd_cp_partition": install_thd_partition,
    "mamba_kernels": install_mamba_kernels,
}

PATCH_NAMES: tuple[str, ...] = (*_MODE_PATCHES, *_INSTALLERS)

# The patches applied in this process, or None before a successful activation.
_active_patches: frozenset[str] | None = None
# Kept referenced so the mode object outlives activation (it stays on the mode stack).
_device_mode: CudaToCpuMode | None = None


def _wants_cpu_runtime(config: Any) -> bool:
    # The config's rules refuse these before launch; reaching here with them is a bug.
    if config.enabled not in ("auto", "on", "off") or config.threads_per_rank < 1:
        raise ValueError(f"invalid CPU runtime config {config}")
    if config.enabled == "auto":
        return not torch.cuda.is_available()
    return config.enabled == "on"


def _enter_device_mode(skip: frozenset[str]) -> None:
    """Pushes the device mode onto this thread's torch-function mode stack for good."""
    global _device_mode
    _device_mode = CudaToCpuMode(
        redirect_devices="device_redirect" not in skip,
        cuda_type_names="cuda_type_names" not in skip,
        backward_in_mode="backward_in_mode" not in skip,
    )
    _device_mode.__enter__()


def activate_cpu_runtime(config: Any, *, skip: frozenset[str] = frozenset()) -> bool:
    """Applies the CPU runtime patches when `config` (the plugin's `CpuRuntimeConfig`: its
    `enabled` and `threads_per_rank`) asks for them; returns whether the runtime is active.

    Call it before building anything with Megatron Core; before or after
    `torch.distributed.init_process_group` and before or after importing megatron.core both
    work. A second call is a no-op. `skip` names patches (from `PATCH_NAMES`) to leave out.
    """
    global _active_patches
    if _active_patches is not None:
        return True
    unknown = set(skip) - set(PATCH_NAMES)
    if unknown:
        raise ValueError(f"unknown CPU runtime patches {sorted(unknown)}; known: {PATCH_NAMES}")
    if not _wants_cpu_runtime(config):
        return False
    torch.set_num_threads(config.threads_per_rank)
    skip = frozenset(skip)
    for name, install in _INSTALLERS.items():
        if name not in skip:
            install()
    if set(_MODE_PATCHES) - skip:
        _enter_device_mode(skip)
    _active_patches = frozenset(PATCH_NAMES) - skip
    return True


def cpu_runtime_active() -> bool:
    """Whether `activate_cpu_runtime` has applied the CPU runtime in this process."""
    return _active_patches is not None

"""The CPU runtime: runs unmodified Megatron Core over gloo on ranks without a CUDA device.

Every fix is a runtime patch; nothing in site-packages is edited. Each patch has a name in
`PATCH_NAMES`, and `activate_cpu_runtime(..., skip=...)` can leave any of them out, so the
self-tests can show what breaks without it. `docs/cpu-runtime.md` says what each patch does and
why; the comments next to each installer cite the Megatron file and line. Whether a process
runs on CPU is the config's (`cluster.device`, `recipes/config/machine.py`); `runtime_for`
activates the runtime when it does and says so in the `RuntimeContext` the plugins are handed.

Activation is process-wide and idempotent. The device mode lives on torch's mode stack, which
is per thread: activate from the thread that will build and train the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plugins.protocol.events import RuntimeContext
from recipes.config.machine import process_on_cpu
from trainer.cpu_runtime.collectives import (
    install_list_split_sizes,
    install_one_gloo_worker,
    install_uneven_all_gather,
)
from trainer.cpu_runtime.cuda_api import disable_dynamo, install_cpu_rng, install_cuda_stand_ins
from trainer.cpu_runtime.device_mode import CudaToCpuMode
from trainer.cpu_runtime.norm import SequenceParallelTorchNorm, adapt_local_layer_spec
from trainer.patch import Patch, PatchSet

__all__ = [
    "PATCH_NAMES",
    "SequenceParallelTorchNorm",
    "activate_cpu_runtime",
    "adapt_cpu_layer_spec",
    "adapt_local_layer_spec",
    "cpu_runtime_active",
    "runtime_for",
]

# Patches carried out by the one process-wide TorchFunctionMode (see device_mode.py).
_MODE_PATCHES = ("device_redirect", "cuda_type_names", "backward_in_mode")

def install_thd_partition() -> None:
    """TE's per-document CP partition for Megatron's packed CP split (`cp_attention.py`)."""
    from trainer.cpu_runtime.cp_attention import install_thd_partition as install

    install()


def install_mamba_kernels() -> None:
    """The torch Mamba2 kernels in Megatron's Mamba mixer (`mamba_kernels.py`)."""
    from trainer.cpu_runtime.mamba_kernels import install_mamba_kernels as install

    install()


def install_offload_split() -> None:
    """The hybrid-device optimizer's offload split by the compute device (`offload.py`)."""
    from trainer.cpu_runtime.offload import install_offload_split as install

    install()


def install_no_te_kernels() -> None:
    """Megatron's own optimizer and router kernels where TE is installed (`no_te_kernels.py`)."""
    from trainer.cpu_runtime.no_te_kernels import install_no_te_kernels as install

    install()


def install_latent_projections() -> None:
    """A latent MoE's duplicated projections in torch (`latent_projection.py`)."""
    from trainer.cpu_runtime.latent_projection import install_latent_projections as install

    install()


# Patches that are one installer each, in the order they are applied.
_INSTALLERS: dict[str, Callable[[], None]] = {
    "cuda_stand_ins": install_cuda_stand_ins,
    "rng": install_cpu_rng,
    "eager": disable_dynamo,
    "gloo_one_worker": install_one_gloo_worker,
    "gloo_uneven_all_gather": install_uneven_all_gather,
    "all_to_all_list_splits": install_list_split_sizes,
    "thd_cp_partition": install_thd_partition,
    "mamba_kernels": install_mamba_kernels,
    "offload_split": install_offload_split,
    "moe_latent_projections": install_latent_projections,
    "no_te_kernels": install_no_te_kernels,
}

PATCH_NAMES: tuple[str, ...] = (*_MODE_PATCHES, *_INSTALLERS)

_UNIT = "tests/unit/test_cpu_runtime.py"
# Each patch in the one table of patches (trainer/megatron_patches.py): what of Megatron Core
# 0.19.2 it works around where it first bites on CPU, and what happens without it.
CPU_RUNTIME_PATCHES: tuple[Patch, ...] = (
    Patch("device_redirect", "CUDA devices Megatron allocates on, e.g. "
          "pipeline_parallel/schedules.py:749", "without it: RuntimeError: Found no NVIDIA "
          "driver on your system", _UNIT),
    Patch("cuda_type_names", "the torch.cuda.FloatTensor type names Megatron asserts, "
          "optimizer/clip_grads.py:174, optimizer/distrib_optimizer.py:466, "
          "optimizer/optimizer.py:1028", "without it: AssertionError / TypeError: Wrapped "
          "parameters must be one of torch.cuda.FloatTensor, ...", _UNIT),
    Patch("backward_in_mode", "autograd functions that allocate on CUDA in backward, "
          "tensor_parallel/layers.py:646", "backward runs outside the device redirect: Found "
          "no NVIDIA driver", _UNIT),
    Patch("cuda_stand_ins", "CUDA streams, events, synchronize and device calls, "
          "distributed/param_and_grad_buffer.py:632, pipeline_parallel/p2p_communication.py:263",
          "without it: Found no NVIDIA driver from streams, events, sync, device calls", _UNIT),
    Patch("rng", "the CUDA RNG tracker, tensor_parallel/random.py:174, :303",
          "without it seeding is silently lost and reading the state raises", _UNIT),
    Patch("eager", "torch.compile'd fused helpers, jit.py:21 (e.g. transformer/moe/router.py:727)",
          "without it TorchInductor compiles Megatron's fused helpers on CPU", _UNIT),
    Patch("gloo_one_worker", "torch's ProcessGroupGloo::runLoop (2.13): its two workers record "
          "the last collective's name unlocked; Megatron FSDP's overlapped coalesced gathers, "
          "distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:4561", "rarely, a rank "
          "dies: malloc(): unaligned tcache chunk detected, or SIGSEGV (AddressSanitizer: "
          "attempting double-free in runLoop)", _UNIT),
    Patch("gloo_uneven_all_gather", "all_gather_into_tensor of uneven shards, "
          "tensor_parallel/mappings.py:154", "gloo refuses it: ProcessGroupGloo::allgather: "
          "invalid tensor size at index N", "tests/dist/test_cpu_runtime_dist.py"),
    Patch("all_to_all_list_splits", "all_to_all_single with tensor split sizes, "
          "tensor_parallel/mappings.py:460 (sizes from transformer/moe/moe_utils.py:1184)",
          "gloo takes lists only: TypeError: all_to_all_single(): incompatible function "
          "arguments", "tests/dist/test_cpu_runtime_dist.py"),
    Patch("thd_cp_partition", "Transformer Engine's thd_get_partitioned_indices, utils.py:2441 "
          "(tex is None without TE, :58-64; a CUDA kernel with it)", "a packed row cannot be "
          "split for CP on CPU: AttributeError: 'NoneType' object has no attribute "
          "'thd_get_partitioned_indices' (Found no NVIDIA driver where TE is installed)",
          "tests/dist/test_context_parallel.py"),
    Patch("mamba_kernels", "mamba-ssm's and causal-conv1d's kernels bound at import, "
          "ssm/mamba_mixer.py:202-205", "without them no Mamba layer builds: ImportError: "
          "MambaSSM is not installed", _UNIT),
    Patch("offload_split", "HybridDeviceOptimizer._get_sub_optimizer_param_groups, "
          "optimizer/cpu_offloading/hybrid_optimizer.py:251-300 (splits by param.is_cuda)",
          "without it a CPU rank offloads nothing and the first step fails: KeyError in "
          "_set_sub_optimizer_grads (hybrid_optimizer.py:101)", _UNIT),
    Patch("moe_latent_projections", "the latent MoE's projections, TELinear in duplicated mode, "
          "transformer/moe/moe_layer.py:264-289 (None without TE, :61-64)", "without it no "
          "latent MoE builds: AssertionError: TransformerEngine is required for MoE latent "
          "projections", _UNIT),
    Patch("no_te_kernels", "the kernels Megatron binds from Transformer Engine at import when "
          "TE is installed: FusedAdam and the multi-tensor kernels, optimizer/clip_grads.py:"
          "10-47, optimizer/__init__.py:13-35; the router GEMM, transformer/moe/moe_utils.py:1326",
          "with TE installed a CPU run fails: CUDA driver version is insufficient "
          "(clip_grads.py:116), Found no NVIDIA driver (moe_utils.py:1326)", _UNIT),
)

# The patches applied in this process: `applied` is None before a successful activation.
_PATCHES = PatchSet("CPU runtime patches", _INSTALLERS, PATCH_NAMES)
# Kept referenced so the mode object outlives activation (it stays on the mode stack).
_device_mode: CudaToCpuMode | None = None


def _enter_device_mode(skip: frozenset[str]) -> None:
    """Pushes the device mode onto this thread's torch-function mode stack for good, unless
    every patch it carries is skipped."""
    global _device_mode
    if not set(_MODE_PATCHES) - skip:
        return
    _device_mode = CudaToCpuMode(
        redirect_devices="device_redirect" not in skip,
        cuda_type_names="cuda_type_names" not in skip,
        backward_in_mode="backward_in_mode" not in skip,
    )
    _device_mode.__enter__()


def activate_cpu_runtime(threads_per_rank: int = 1, *,
                         skip: frozenset[str] = frozenset()) -> None:
    """Applies the CPU runtime patches, with `threads_per_rank` torch threads in this process.

    Call it before building anything with Megatron Core; before or after
    `torch.distributed.init_process_group` and before or after importing megatron.core both
    work. A second call is a no-op. `skip` names patches (from `PATCH_NAMES`) to leave out.
    """

    def set_threads() -> None:
        if threads_per_rank < 1:  # the config's rule refuses it before launch
            raise ValueError(f"threads_per_rank={threads_per_rank} must be at least 1")
        torch.set_num_threads(threads_per_rank)

    _PATCHES.install_once(skip, before=set_threads, after=_enter_device_mode)


def cpu_runtime_active() -> bool:
    """Whether `activate_cpu_runtime` has applied the CPU runtime in this process."""
    return _PATCHES.applied is not None


def runtime_for(cluster: Any, *, dry_run: bool = False) -> RuntimeContext:
    """This process's runtime under `cluster` (the run's `ClusterConfig`): on CPU (`cluster.
    device=cpu`, or `auto` without CUDA) the CPU runtime is activated, ranks talk over gloo and
    each full weight is drawn on CPU and then split by TP, so every layout starts equal."""
    if not process_on_cpu(cluster, cuda=torch.cuda.is_available()):
        return RuntimeContext(dry_run=dry_run)
    activate_cpu_runtime(cluster.threads_per_rank)
    return RuntimeContext(dry_run=dry_run, backend="gloo", device="cpu",
                          cpu_initialization=True)


def adapt_cpu_layer_spec(spec: Any, config: Any) -> Any:
    """A local layer spec made to run on CPU ranks (the runtime must be active): local-spec norms
    cannot run sequence parallel on CPU, and local attention refuses packed batches and CP, so
    the sequence-parallel norm, the packed attention and, under CP, the reference CP attention
    are swapped in; the swapped-in attentions run other batches exactly as before."""
    from trainer.cpu_runtime.packed_attention import use_packed_attention

    spec = use_packed_attention(adapt_local_layer_spec(spec, config))
    if config.context_parallel_size > 1:
        from trainer.cpu_runtime.cp_attention import use_cp_attention

        spec = use_cp_attention(spec)
    return spec

"""CPU stand-ins for the parts of the `torch.cuda` API that Megatron Core calls unconditionally.

Without a driver every one of these raises `Found no NVIDIA driver`. On CPU all work runs in
program order on one device, so streams and events have nothing to order and synchronising is a
no-op. Every stand-in is its own function object: torch._dynamo indexes torch's functions and
asserts "Duplicate torch object" when one object sits under two names.
"""

from __future__ import annotations

import contextlib
import logging

import torch


class CpuEvent:
    """Stand-in for `torch.cuda.Event`: on CPU, work is complete once the call returns."""

    def __init__(
        self,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        **_: object,
    ) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: object = None) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: CpuEvent) -> float:
        return 0.0


class CpuStream:
    """Stand-in for `torch.cuda.Stream`: one in-order CPU queue, so every wait is satisfied."""

    def __init__(self, device: object = None, priority: int = 0, **_: object) -> None:
        self.priority = priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return (0, 0)

    def wait_stream(self, stream: CpuStream) -> None:
        return None

    def wait_event(self, event: CpuEvent) -> None:
        return None

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        return event if event is not None else CpuEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_THE_CPU_STREAM = CpuStream()


def current_device() -> int:
    # Megatron passes this int on as `device=`; the device mode maps it back to CPU.
    return 0


def synchronize(device: object = None) -> None:
    return None


def set_device(device: object) -> None:
    return None


def empty_cache() -> None:
    return None


def is_available() -> bool:
    # A CPU rank on a machine with GPUs (`cluster.device=cpu`) must not take the paths that
    # torch.cuda.is_available() opens: Transformer Engine's layers, CUDA RNG state, device memory.
    return False


def current_stream(device: object = None) -> CpuStream:
    return _THE_CPU_STREAM


def default_stream(device: object = None) -> CpuStream:
    return _THE_CPU_STREAM


def stream(stream: object) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(stream)


CUDA_STAND_INS = {
    "current_device": current_device,
    "synchronize": synchronize,
    "set_device": set_device,
    "empty_cache": empty_cache,
    "is_available": is_available,
    "Stream": CpuStream,
    "Event": CpuEvent,
    "current_stream": current_stream,
    "default_stream": default_stream,
    "stream": stream,
}


def record_stream(self: torch.Tensor, stream: object) -> None:
    # CUDA caching-allocator bookkeeping; CPU memory is not tied to streams. Replaced on the
    # class, not in the device mode: torch checks the argument is a real Stream before any
    # __torch_function__ dispatch, and Megatron passes it a CpuStream from current_stream().
    return None


def install_cuda_stand_ins() -> None:
    """Replaces the `torch.cuda` names Megatron Core calls on its training path."""
    for name, stand_in in CUDA_STAND_INS.items():
        setattr(torch.cuda, name, stand_in)
    torch.Tensor.record_stream = record_stream


# ---- RNG: the "CUDA" generator becomes the CPU default generator --------------------------
# Without a GPU, `torch.cuda.manual_seed` and Megatron's `_set_cuda_rng_state` only queue their
# work through `_lazy_call`, which never runs (`tensor_parallel/random.py:174, 305, 490`), and
# `torch.cuda.get_rng_state` raises (`random.py:303`). CPU kernels (dropout, init) draw from the
# CPU default generator, so that is the generator the tracker must seed, save and restore for TP
# ranks to get distinct model-parallel streams. Caveat: on CPU the "CUDA" and CPU generators
# are one.


def cuda_manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def cuda_manual_seed_all(seed: int) -> None:
    # Must not call torch.manual_seed: that calls torch.cuda.manual_seed_all (infinite loop).
    torch.default_generator.manual_seed(int(seed))


def cuda_get_rng_state(device: object = "cuda") -> torch.Tensor:
    return torch.default_generator.get_state()


def cuda_set_rng_state(new_state: torch.Tensor, device: object = "cuda") -> None:
    torch.default_generator.set_state(new_state)


def megatron_get_cuda_rng_state(
    device: object = "cuda", clone: bool = False, graph_safe: bool = False
) -> torch.Tensor:
    return torch.default_generator.get_state()


def megatron_set_cuda_rng_state(
    new_state: torch.Tensor, device: object = -1, graph_safe: bool = False
) -> None:
    torch.default_generator.set_state(new_state)


class _SharedGeneratorWarningFilter(logging.Filter):
    """Drops the tracker's 'CPU RNG state changed within GPU RNG context' warning
    (`tensor_parallel/random.py:333`): with one shared generator every draw inside a fork
    changes the CPU state, by design, and fork restores it on exit."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def install_cpu_rng() -> None:
    """Maps torch.cuda's and Megatron's CUDA-generator functions onto the CPU generator."""
    import megatron.core.tensor_parallel.random as megatron_random

    for namespace in (torch.cuda, torch.cuda.random):
        namespace.manual_seed = cuda_manual_seed
        namespace.manual_seed_all = cuda_manual_seed_all
        namespace.get_rng_state = cuda_get_rng_state
        namespace.set_rng_state = cuda_set_rng_state
    # Looked up as module globals at call time by the tracker (add, fork) and by activation
    # recompute (CheckpointFunction), so replacing the module attributes reaches every caller.
    megatron_random._get_cuda_rng_state = megatron_get_cuda_rng_state
    megatron_random._set_cuda_rng_state = megatron_set_cuda_rng_state
    logging.getLogger(megatron_random.__name__).addFilter(_SharedGeneratorWarningFilter())


def disable_dynamo() -> None:
    """Runs torch.compile'd functions eagerly: Megatron compiles at import time (`jit_fuser` in
    `jit.py:21`, MoE router `router.py:727`), and CPU compilation is slow or fails; the setting
    is read at call time, so it also covers functions decorated before activation."""
    import torch._dynamo

    torch._dynamo.config.disable = True

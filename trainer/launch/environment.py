"""The environment GPU ranks need, set by every launch path (the local launcher and the Slurm
script), never over a value the user set.

- `CUDA_DEVICE_MAX_CONNECTIONS=1` with TP > 1 or CP > 1: Megatron-LM refuses to start without it
  before Blackwell (`megatron/training/arguments.py:1413-1439`): with one hardware queue the
  tensor- and context-parallel communication kernels are issued in the order Megatron overlaps
  them with compute; with several, a later GEMM can overtake a collective and stall it. Not
  under Megatron FSDP, which Megatron-LM refuses to run with it (`arguments.py:1143-1144`: its
  parameter all-gathers must overlap the compute on other queues).
- `TORCH_NCCL_AVOID_RECORD_STREAMS=1`: NCCL frees the buffers of asynchronous collectives when
  they complete instead of recording them on the compute stream, which holds memory longer
  and fragments the caching allocator (Megatron Bridge's performance recipes set it).
- `NCCL_NVLS_ENABLE=0`: NVLink SHARP reserves GPU memory for its buffers on every rank; Megatron
  Bridge's recipes turn it off for pretraining.
- `NVTE_CPU_OFFLOAD_V1=1` with activation offloading (`train.offload_modules`): Megatron-LM
  refuses to start without it on Transformer Engine 2.10 and later, whose newer offloading
  would move weights too (`megatron/training/arguments.py:1854-1859`).
"""

from __future__ import annotations

from typing import Any


def gpu_environment(cfg: Any) -> dict[str, str]:
    """What the ranks of `cfg` need in their environment on GPU nodes."""
    environment = {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "NCCL_NVLS_ENABLE": "0"}
    if (cfg.layout.tensor > 1 or cfg.layout.context > 1) and cfg.optimizer.fsdp == "none":
        environment["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if cfg.train.offload_modules:
        environment["NVTE_CPU_OFFLOAD_V1"] = "1"
    return environment


def cpu_environment(cfg: Any) -> dict[str, str]:
    """What CPU ranks need: as many torch threads as `cluster.threads_per_rank`, set before the
    launcher reads it, so the ranks of a node do not oversubscribe its cores."""
    return {"OMP_NUM_THREADS": str(cfg.cluster.threads_per_rank)}


def shell_exports(environment: dict[str, str]) -> list[str]:
    """The same as `export` lines that keep a value the job's environment already has."""
    return [f'export {key}="${{{key}:-{value}}}"' for key, value in sorted(environment.items())]

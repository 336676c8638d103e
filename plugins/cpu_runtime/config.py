"""Config of the CPU runtime plugin (torch-free): when it runs, and how many threads a rank gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from plugins.protocol.hooks import Plugin, PluginConfig, Rule


def check_threads_per_rank(cfg: Any) -> str | None:
    threads = cfg.plugins.cpu_runtime.threads_per_rank
    if threads < 1:
        return (
            f"plugins.cpu_runtime.threads_per_rank={threads} must be at least 1; "
            "set plugins.cpu_runtime.threads_per_rank=1"
        )
    return None


@dataclass(kw_only=True)
class CpuRuntimeConfig(PluginConfig):
    """Runs unmodified Megatron Core over gloo when there is no CUDA device."""

    enabled: Literal["auto", "on", "off"] = "auto"  # auto = on exactly when CUDA is absent
    threads_per_rank: int = 1  # torch intra-op threads per local rank

    def rules(self) -> tuple[Rule, ...]:
        return (check_threads_per_rank,)

    def build(self) -> Plugin | None:
        if self.enabled == "off":
            return None
        from plugins.cpu_runtime.plugin import CpuRuntimePlugin

        return CpuRuntimePlugin(self)

    def runs_ranks_on_cpu(self, gpus: int, nodes: int) -> bool:
        # 'auto' never turns a multi-node launch into CPU ranks: a GPU node without GPUs is
        # a broken allocation, not a request for the CPU runtime.
        return self.enabled == "on" or (self.enabled == "auto" and gpus == 0 and nodes == 1)

    def launch_environment(self) -> dict[str, str]:
        # Set before the launcher reads it, so ranks do not oversubscribe the cores.
        return {"OMP_NUM_THREADS": str(self.threads_per_rank)}

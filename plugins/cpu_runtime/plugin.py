"""The CPU runtime as a plugin: it decides the backend before process groups exist, and swaps
the local spec's norms for sequence-parallel-capable ones. The trainer never names it."""

from __future__ import annotations

from typing import Any

from plugins.cpu_runtime.runtime import activate_cpu_runtime, adapt_local_layer_spec
from plugins.protocol import Plugin, RuntimeContext


class CpuRuntimePlugin(Plugin):
    def __init__(self, config: Any) -> None:  # the plugin's CpuRuntimeConfig
        self.config = config
        self.active = False

    def setup_runtime(self, runtime: RuntimeContext) -> None:
        self.active = activate_cpu_runtime(self.config)
        if self.active:
            runtime.backend = "gloo"
            runtime.device = "cpu"
            # Each full weight is drawn on CPU, then split by TP: every layout starts equal.
            runtime.cpu_initialization = True

    def layer_spec(self, spec: Any, config: Any) -> Any:
        # Local-spec norms cannot run sequence parallel on CPU; the plugin swaps them.
        return adapt_local_layer_spec(spec, config) if self.active else spec

"""The CPU runtime as a plugin: it decides the backend before process groups exist, and adapts the
local spec to CPU: sequence-parallel-capable norms, an attention that takes packed (THD)
batches (`packed_attention.py`) and, under context parallel, a reference CP attention
(`cp_attention.py`, a test backend). The trainer never names it."""

from __future__ import annotations

from typing import Any

from plugins.cpu_runtime.packed_attention import use_packed_attention
from plugins.cpu_runtime.runtime import activate_cpu_runtime, adapt_local_layer_spec
from plugins.protocol.events import RuntimeContext
from plugins.protocol.hooks import Plugin


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
        if not self.active:
            return spec
        # Local-spec norms cannot run sequence parallel on CPU, and local attention refuses
        # packed batches and CP; the swapped-in attentions run other batches exactly as before.
        spec = use_packed_attention(adapt_local_layer_spec(spec, config))
        if config.context_parallel_size > 1:
            from plugins.cpu_runtime.cp_attention import use_cp_attention

            spec = use_cp_attention(spec)
        return spec

"""The one explicit list of plugins: the fields of `PluginsConfig`, in the order hooks run.

Adding a plugin is one field here; its config class (torch-free, beside its code) brings its
rules, says from the run config whether it is on, and builds the plugin. The schema composes
`PluginsConfig` into the run config; the trainer gets a `PluginSet` from `build_plugins(cfg)`
and never names a plugin.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from plugins.context_parallel.config import ContextParallelConfig
from plugins.fp8.config import Fp8Config
from plugins.logging.config import LoggingConfig
from plugins.moe.config import MoeConfig
from plugins.packing.config import PackingConfig
from plugins.profiler.config import ProfilerConfig
from plugins.protocol.hooks import GemmInputs, GemmWeights, PluginConfig, PluginSet, Rule


@dataclass(kw_only=True)
class PluginsConfig:
    """Features that attach at the trainer's hook points (`plugins/protocol/hooks.py`)."""

    fp8: Fp8Config = field(default_factory=Fp8Config)
    packing: PackingConfig = field(default_factory=PackingConfig)
    context_parallel: ContextParallelConfig = field(default_factory=ContextParallelConfig)
    moe: MoeConfig = field(default_factory=MoeConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # last: sees every figure

    def configs(self) -> list[tuple[str, PluginConfig]]:
        """(name, config) of every plugin, in registry order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def rules(self) -> tuple[Rule, ...]:
        """Every plugin's validation rules, in registry order."""
        return tuple(rule for _, config in self.configs() for rule in config.rules())

    def retired_keys(self) -> dict[str, str]:
        """Every plugin's retired keys, dotted from the root (`plugins.<name>.<key>`)."""
        return {f"plugins.{name}.{key}": text for name, config in self.configs()
                for key, text in config.retired_keys().items()}

    def gpu_checks(self) -> dict[str, list[str]]:
        """Every plugin's GPU check runs, by name, in registry order."""
        return {name: overrides for _, config in self.configs()
                for name, overrides in config.gpu_checks().items()}

    def gemm_precision(self) -> str | None:
        """The GEMMs' number format a plugin sets (the last in registry order wins), or None."""
        found = [p for _, config in self.configs() if (p := config.gemm_precision())]
        return found[-1] if found else None

    def gemm_weights(self, cfg) -> GemmWeights | None:
        """How an active plugin stores the GEMM weights (the first that says), or None."""
        found = [w for _, config in self.configs() if config.active(cfg)
                 and (w := config.gemm_weights()) is not None]
        return found[0] if found else None

    def gemm_inputs(self, cfg) -> GemmInputs | None:
        """How an active plugin keeps its GEMMs' saved inputs (the first that says), or None."""
        found = [i for _, config in self.configs() if config.active(cfg)
                 and (i := config.gemm_inputs()) is not None]
        return found[0] if found else None

    def ddp_fields(self, cfg) -> dict:
        """What the active plugins set in Megatron's data-parallel config (later plugins win)."""
        return {key: value for _, config in self.configs() if config.active(cfg)
                for key, value in config.ddp_fields().items()}

    def optimizer_fields(self, cfg) -> dict:
        """What the active plugins set in Megatron's optimizer config (later plugins win)."""
        return {key: value for _, config in self.configs() if config.active(cfg)
                for key, value in config.optimizer_fields().items()}

    def process_group_options(self, cfg) -> dict:
        """What the plugins add to Megatron's process-group set-up (later plugins win)."""
        return {key: value for _, config in self.configs()
                for key, value in config.process_group_options(cfg).items()}


def build_plugins(cfg: Any) -> PluginSet:
    """The plugins the run config `cfg` turns on, each named by its field (the whole run config,
    not its `plugins` section: some plugins follow fields elsewhere, e.g. `data.documents`)."""
    built = PluginSet()
    for name, config in cfg.plugins.configs():
        plugin = config.build() if config.active(cfg) else None
        if plugin is not None:
            plugin.name = name
            built.plugins.append(plugin)
    return built

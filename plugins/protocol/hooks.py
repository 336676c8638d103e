"""The contract between the trainer and its plugins: hook points and plugin configs with rules.

Both sides import this module and it imports neither: the trainer calls hooks on a `PluginSet`
without knowing any plugin by name, and a plugin implements the hooks it needs by overriding
`Plugin` methods. Each plugin's torch-free config dataclass derives from `PluginConfig`: it
carries the plugin's validation rules, says from the whole run config whether the plugin is on
(`active`), and builds it. A plugin that the run config already implies (packing follows
`data.documents`, context parallel `parallel.context`) decides from those fields, so no second
switch has to be kept in step with them. The one explicit list of plugins is
`plugins/registry.py`.

Hook points, in the order a run meets them (the typed events are in `events.py`; Megatron Core
or torch objects are typed `Any` and named here, so the contract stays torch-free):

    setup_runtime(runtime)          once per process, before any process group exists; the dry
                                    run calls it too. A plugin may choose backend and device.
    transformer_config(config)      the TransformerConfig after translation -> config
    layer_spec(spec, config)        each model chunk's decoder-block spec -> spec
    run_start(start)                after the session is built (and a checkpoint loaded)
    microbatch(batch)               each micro-batch dict on the compute device -> batch
                                    (slice for context parallel, add packing metadata)
    forward_kwargs(batch, kwargs)   keyword arguments of GPTModel.forward for that batch -> kwargs
                                    (e.g. packed_seq_params)
    after_update(step)              right after each optimizer update, on every rank, before
                                    the step's figures are known: for a plugin that acts
                                    between steps as they happen (the profiler's window)
    after_step(metrics)             each step's figures, on every rank, in step order, once the
                                    loop has summed them over the world (at the log interval,
                                    before an evaluation or checkpoint, at a stop, at the last
                                    step); a plugin may add its figures to `metrics.extra`
                                    (logged with the step)
    after_eval(evaluation)          after every held-out evaluation, on every rank
    state_dict() / load_state_dict(state)   the plugin's part of the checkpointed run state
    run_end(summary)                once, after training and the final checkpoint

Rules have the core rules' form (`recipes/config/validation.py`): a pure function of the whole
run config that returns None, or one sentence naming the field, its value and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from plugins.protocol.events import EvalResult, RunStart, RuntimeContext, StepMetrics

Rule = Callable[[Any], str | None]


@dataclass(frozen=True, kw_only=True)
class KeptEnds:
    """The layers at each end of the model that a plugin's low-precision region leaves in the
    run's dtype (counted as Megatron counts layers: a hybrid model's every pattern symbol, a GPT
    model's every transformer layer)."""

    first_layers_kept: int = 0
    last_layers_kept: int = 0


@dataclass(frozen=True)
class GemmWeights(KeptEnds):
    """GEMM weights stored in another format than the run's dtype: bytes per element, outside
    the kept end layers."""

    bytes_per_weight: float  # 1 for FP8, 0.5 for NVFP4


@dataclass(frozen=True)
class GemmInputs(KeptEnds):
    """How the GEMMs a plugin quantizes keep their inputs for the backward: bytes per element of
    the quantized copy a linear saves in place of its input (its block scales included),
    outside the kept end layers."""

    bytes_per_element: float  # 1 for per-tensor FP8, 1 + 1/32 for MXFP8, 0.5 + 1/16 for NVFP4


@dataclass(frozen=True)
class ProfileWindow:
    """Steps first..last (1-based) a plugin runs torch.profiler over, and the key that moves
    them (named in the refusal when they overlap the trainer's own profiled steps)."""

    first: int
    last: int
    start_key: str


class Plugin:
    """Base of every plugin: each hook is a no-op until a plugin overrides it."""

    name: str = "plugin"  # its field name under `plugins.` in the config

    def setup_runtime(self, runtime: RuntimeContext) -> None:
        return None

    def transformer_config(self, config: Any) -> Any:
        return config

    def layer_spec(self, spec: Any, config: Any) -> Any:
        return spec

    def run_start(self, start: RunStart) -> None:
        return None

    def microbatch(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch

    def forward_kwargs(self, batch: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    def after_update(self, step: int) -> None:
        return None

    def after_step(self, metrics: StepMetrics) -> None:
        return None

    def after_eval(self, evaluation: EvalResult) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def run_end(self, summary: dict[str, Any]) -> None:
        return None


class PluginConfig:
    """Base of each plugin's config dataclass: its rules, and the plugin it builds."""

    def rules(self) -> tuple[Rule, ...]:
        """This plugin's validation rules (pure functions of the whole run config)."""
        return ()

    def active(self, cfg: Any) -> bool:
        """Whether the plugin is on in the run config `cfg`: from its own switch where using it
        is a real choice (fp8's format, the profiler), from the fields the user already sets
        where the run implies it (packing from `data.documents`). A check elsewhere that
        needs to know asks this (the Mamba CP machine check asks packing). Pure and
        torch-free; the default (on) leaves the decision to `build`."""
        return True

    def build(self) -> Plugin | None:
        """The plugin, asked only when `active` (None: it has nothing to add after all).
        Imports torch lazily."""
        return None

    def retired_keys(self) -> dict[str, str]:
        """Keys this plugin's section once had and has no more, by name within the section ->
        what became of each and what to set instead (the line an override that still sets it
        gets: `plugins.<name>.<key> was <text>`); a saved config.yaml that holds one drops it."""
        return {}

    def gpu_checks(self) -> dict[str, list[str]]:
        """Runs that exercise this plugin on a GPU (`scripts/gpu_check_precision.py` trains each
        on a small model): check name -> the overrides that configure the plugin so; {} for
        none. The plugin names its own keys here, so the tool never does."""
        return {}

    def ddp_fields(self) -> dict[str, Any]:
        """Fields of Megatron's `DistributedDataParallelConfig` this plugin, so configured,
        sets (asked only when `active`; the one translation adds them), e.g. FP8's parameter
        all-gather; {} for none."""
        return {}

    def optimizer_fields(self) -> dict[str, Any]:
        """Fields of Megatron's optimizer `OptimizerConfig` this plugin, so configured, sets
        (asked only when `active`), e.g. the FP8 recipe its FP8 parameters are cast with; {}
        for none."""
        return {}

    def megatron_lm_args(self) -> list[str]:
        """This plugin's settings as Megatron-LM `pretrain_gpt.py` flags (`print=megatron_args`),
        [] while it is off or has none."""
        return []

    def megatron_lm_dests(self) -> tuple[str, ...]:
        """The Megatron-LM parsed-argument names `from_megatron_lm` reads."""
        return ()

    def from_megatron_lm(self, values: Any) -> dict[str, Any]:
        """This section's fields (by name) from Megatron-LM's parsed arguments (a mapping of
        argument names), {} to leave the defaults (`megatron_args=FILE`)."""
        return {}

    def gemm_weights(self) -> GemmWeights | None:
        """How this plugin, so configured, stores the model's GEMM weights when not in the run's
        dtype (FP8 parameters: one byte each, the BF16 end layers excepted); None: it leaves
        them be. The planner prices weights and their data-parallel all-gather by it."""
        return None

    def gemm_inputs(self) -> GemmInputs | None:
        """How this plugin, so configured, keeps the inputs its quantized GEMMs save for the
        backward (FP8 or FP4: a quantized copy instead of the run's dtype, the BF16 end layers
        excepted); None: it leaves them be. The planner prices activations by it."""
        return None

    def gemm_precision(self) -> str | None:
        """The number format this plugin, so configured, runs the model's GEMMs in (a cluster
        file's `peak_tflops` key, e.g. "fp8"), or None when it leaves them in the run's
        dtype; the planner prices step time at that peak."""
        return None

    def process_group_options(self, cfg: Any) -> dict[str, Any]:
        """Keyword arguments this plugin, so configured, adds to Megatron Core's
        `initialize_model_parallel` (called once, by the one translation), e.g. the sizes of
        hierarchical context-parallel groups; {} for none."""
        return {}

    def profile_window(self, cfg: Any) -> ProfileWindow | None:
        """The steps this plugin, so configured, runs torch.profiler over (None: it profiles
        none); the trainer refuses an overlap with its own profiled steps before launch."""
        return None

    def machine_problem(self, cfg: Any, machine: Any, on_cpu: bool) -> str | None:
        """What this machine lacks for this plugin as configured in the run config `cfg` (a
        need may depend on other sections, e.g. the layers recomputed), as one line naming the
        field, its value and the fix, or None. `machine` is the machine check's description
        (GPUs, compute capability, Transformer Engine version; `recipes/config/machine.py`) and
        `on_cpu` whether the ranks will run on CPU; asked before any rank starts."""
        return None


@dataclass
class PluginSet:
    """The active plugins of a run, in registry order; the trainer calls hooks only here."""

    plugins: list[Plugin] = field(default_factory=list)

    def __iter__(self) -> Iterator[Plugin]:
        return iter(self.plugins)

    def setup_runtime(self, runtime: RuntimeContext) -> RuntimeContext:
        for plugin in self.plugins:
            plugin.setup_runtime(runtime)
        return runtime

    def transformer_config(self, config: Any) -> Any:
        for plugin in self.plugins:
            config = plugin.transformer_config(config)
        return config

    def layer_spec(self, spec: Any, config: Any) -> Any:
        for plugin in self.plugins:
            spec = plugin.layer_spec(spec, config)
        return spec

    def run_start(self, start: RunStart) -> None:
        for plugin in self.plugins:
            plugin.run_start(start)

    def microbatch(self, batch: dict[str, Any]) -> dict[str, Any]:
        for plugin in self.plugins:
            batch = plugin.microbatch(batch)
        return batch

    def forward_kwargs(self, batch: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        for plugin in self.plugins:
            kwargs = plugin.forward_kwargs(batch, kwargs)
        return kwargs

    def after_update(self, step: int) -> None:
        for plugin in self.plugins:
            plugin.after_update(step)

    def after_step(self, metrics: StepMetrics) -> None:
        for plugin in self.plugins:
            plugin.after_step(metrics)

    def after_eval(self, evaluation: EvalResult) -> None:
        for plugin in self.plugins:
            plugin.after_eval(evaluation)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Each plugin's checkpoint state under its name (plugins without state are left out)."""
        return {plugin.name: state for plugin in self.plugins if (state := plugin.state_dict())}

    def load_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        for plugin in self.plugins:
            if plugin.name in states:
                plugin.load_state_dict(states[plugin.name])

    def run_end(self, summary: dict[str, Any]) -> None:
        for plugin in self.plugins:
            plugin.run_end(summary)

"""The plugin protocol: hooks run in registry order, chain their results, and carry state."""

from __future__ import annotations

import dataclasses

import pytest

from plugins.fp8.config import Fp8Config
from plugins.protocol.events import EvalResult, RuntimeContext, StepMetrics
from plugins.protocol.hooks import Plugin, PluginSet
from plugins.registry import PluginsConfig, build_plugins
from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe


class Recorder(Plugin):
    """A plugin that appends its name to whatever passes through, and remembers events."""

    def __init__(self, name: str, state: dict | None = None) -> None:
        self.name = name
        self.events: list[str] = []
        self.state = state or {}

    def microbatch(self, batch):
        return {**batch, "seen": [*batch.get("seen", []), self.name]}

    def forward_kwargs(self, batch, kwargs):
        return {**kwargs, self.name: batch["seen"]}

    def after_step(self, metrics):
        self.events.append(f"step {metrics.step}")

    def after_eval(self, evaluation):
        self.events.append(f"eval {evaluation.step} {evaluation.loss}")

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_hooks_chain_in_order_and_reach_every_plugin():
    first, second = Recorder("first"), Recorder("second")
    plugins = PluginSet([first, second])
    batch = plugins.microbatch({"tokens": 1})
    assert batch["seen"] == ["first", "second"]
    kwargs = plugins.forward_kwargs(batch, {"input_ids": 1})
    assert kwargs == {"input_ids": 1, "first": ["first", "second"], "second": ["first", "second"]}
    plugins.after_step(StepMetrics(step=3, loss=1.0, lr=0.1, grad_norm=1.0, loss_tokens=10,
                                   step_time_s=0.5))
    plugins.after_eval(EvalResult(step=3, loss=2.5, loss_tokens=7))
    assert first.events == second.events == ["step 3", "eval 3 2.5"]


def test_plugin_state_round_trips_by_name_and_empty_states_are_left_out():
    saved = PluginSet([Recorder("a", {"count": 4}), Recorder("b")]).state_dict()
    assert saved == {"a": {"count": 4}}
    fresh_a, fresh_b = Recorder("a"), Recorder("b", {"kept": 1})
    PluginSet([fresh_a, fresh_b]).load_state_dict(saved)
    assert fresh_a.state == {"count": 4} and fresh_b.state == {"kept": 1}


def test_registry_builds_only_what_the_config_turns_on_and_names_it():
    def built(*overrides: str) -> list[str]:
        return [p.name for p in build_plugins(apply_overrides(get_recipe("tiny_dp1"), overrides))]

    # fp8 is off by default; logging is on by default (each run draws its loss curve).
    assert built() == ["logging"]
    assert built("plugins.fp8.format=hybrid") == ["fp8", "logging"]


@pytest.mark.parametrize(("recipe", "built"), [
    ("tiny_dp1", False), ("tiny_dp2", False), ("tiny_tp2_pp2", False),
    ("tiny_cp2", True), ("tiny_cp4", True),
])
def test_context_parallel_is_built_exactly_when_parallel_context_is_above_one(recipe, built):
    cfg = get_recipe(recipe)
    names = [p.name for p in build_plugins(cfg)]
    assert ("context_parallel" in names) == built == (cfg.parallel.context > 1), recipe
    assert cfg.plugins.context_parallel.active(cfg) == built
    # comm_type stays a setting: it is carried by the plugin that is built.
    cfg.plugins.context_parallel.comm_type = "all_gather"
    plugins = build_plugins(cfg)
    carried = [p.config.comm_type for p in plugins if p.name == "context_parallel"]
    assert carried == (["all_gather"] if built else [])


def test_every_plugin_config_brings_its_rules():
    config = PluginsConfig()
    names = [name for name, _ in config.configs()]
    assert names == [f.name for f in dataclasses.fields(PluginsConfig)]
    assert {rule.__name__ for rule in config.rules()} == {
        "check_fp8_settings_unused", "check_fp8_needs_te_layers", "check_fp8_delayed_settings",
        "check_fp4_format_and_recipe",
        "check_fp8_scaling_values", "check_fp8_bf16_layers_recipe", "check_fp8_bf16_layers_range",
        "check_fp8_bf16_layers_leave_fp8", "check_fp8_shapes", "check_fp8_param_gather_distributed",
        "check_fp8_param_gather_master", "check_fp8_delayed_recompute_modules",
        "check_fp8_param_gather_offload",
        "check_packing_micro_batch", "check_packing_context_parallel",
        "check_cp_hierarchical_sizes", "check_cp_a2a_heads", "check_profiler_counts",
        "check_profiler_window"}


def test_runtime_context_defaults_to_a_cuda_node():
    runtime = PluginSet([]).setup_runtime(RuntimeContext())
    assert (runtime.backend, runtime.device, runtime.cpu_initialization) == ("nccl", "cuda", False)


def test_fp8_plugin_sets_the_format_through_the_transformer_config():
    from recipes.registry import get_recipe
    from trainer.mcore_translation import build_transformer_config

    config = build_transformer_config(get_recipe("tiny_dp1"), cpu_initialization=True)
    assert config.fp8 is None
    plugin = Fp8Config(format="e4m3").build()
    assert plugin is not None and plugin.transformer_config(config).fp8 == "e4m3"

"""The MoE plugin's pieces, without process groups, and the tiny recipes the EP tests compare.

The distributed behaviour (figures reduced over the right ranks, EP layouts equal to one rank)
is tests/dist/test_moe_equivalence.py's; here: the router hook lands in Megatron's own MoE spec
exactly once per MoE layer, tokens count only on training forwards with grad (not evaluation,
not a recompute's first pass), the figures are what their names say, they reach the metrics
record and the step's log line, and the plugin is on exactly in the MoE recipes.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.moe.router import TopKRouter

from plugins.moe.config import MoeConfig
from plugins.moe.plugin import (
    MoePlugin,
    RoutedTokenCounter,
    router_figures,
    tracked_loss_names,
    wrap_routers,
)
from plugins.protocol.events import StepMetrics
from plugins.registry import build_plugins
from recipes.registry import RECIPES, get_recipe
from trainer.metrics import RunReporter

TINY_MOE = [name for name in RECIPES if name.startswith("mixtral_tiny_")]


def _block_spec(num_moe_experts: int | None):
    config = TransformerConfig(
        num_layers=3, hidden_size=64, num_attention_heads=4, num_moe_experts=num_moe_experts,
        add_bias_linear=False, use_cpu_initialization=True,
    )
    return get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=None, pp_rank=0
    )


def _routers(spec) -> list:
    found: list = []
    wrap_routers(spec, lambda router: found.append(router) or router)
    return found


def test_every_moe_layers_router_is_wrapped_once_and_the_spec_is_left_alone():
    spec = _block_spec(num_moe_experts=4)
    wrapped = wrap_routers(spec, lambda router: "counting builder")
    assert _routers(wrapped) == ["counting builder"] * 3
    assert _routers(spec) == [TopKRouter] * 3  # the original spec is not modified


def test_a_dense_spec_has_no_router_to_wrap():
    plugin = MoePlugin(MoeConfig())
    spec = _block_spec(num_moe_experts=None)
    assert _routers(spec) == []
    assert plugin.layer_spec(spec, SimpleNamespace(num_moe_experts=None)) is spec
    metrics = StepMetrics(step=1, loss=1.0, lr=0.1, grad_norm=1.0, loss_tokens=8, step_time_s=1)
    plugin.after_step(metrics)  # no routers: nothing to report, no collective
    assert metrics.extra == {}


class FakeRouter(torch.nn.Module):
    """Returns Megatron's router outputs (probs, routing map) for a fixed routing map."""

    def __init__(self, routing_map: torch.Tensor) -> None:
        super().__init__()
        self.routing_map = routing_map
        self.layer_number = 2

    def forward(self, hidden):
        return hidden.new_ones(self.routing_map.shape), self.routing_map


def test_tokens_count_on_training_forwards_with_grad_only():
    routing_map = torch.tensor([[True, True, False], [False, True, True]])
    counter = RoutedTokenCounter()
    config = SimpleNamespace(num_layers=2, mtp_num_layers=None)
    router = counter.router_builder(FakeRouter, config)(routing_map)
    hidden = torch.zeros(2, 4)
    router(hidden)
    expected = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 1.0]], dtype=torch.float64)
    assert torch.equal(counter.counts, expected)
    with torch.no_grad():  # evaluation, and the first pass of a recomputed layer
        router(hidden)
    router.eval()
    router(hidden)
    assert torch.equal(counter.counts, expected)


def test_an_mtp_depths_router_counts_after_the_decoders_layers():
    """Megatron's MTP layers number themselves from 1 inside a depth: their routers get rows
    after the decoder's, not the decoder's own (router.py's tracker does the same)."""
    routing_map = torch.tensor([[True, False, True]])
    counter = RoutedTokenCounter()
    config = SimpleNamespace(num_layers=2, mtp_num_layers=2)
    decoder = counter.router_builder(FakeRouter, config)(routing_map)
    mtp = counter.router_builder(FakeRouter, config)(routing_map)
    mtp.is_mtp_layer = True
    decoder(torch.zeros(1, 4))
    mtp(torch.zeros(1, 4))
    assert counter.counts.tolist() == [[0, 0, 0], [1, 0, 1], [0, 0, 0], [1, 0, 1]]


def test_figures_are_the_worst_layers_imbalance_and_tokens_per_expert_per_layer():
    # Two MoE layers, 4 tokens x top-2 each: 8 routed tokens per layer.
    per_layer = torch.tensor([[6.0, 2.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    figures = router_figures(per_layer, per_expert=True)
    assert figures == {"moe_imbalance": 3.0, "moe_tokens_e0": 4.0, "moe_tokens_e1": 2.0,
                       "moe_tokens_e2": 1.0, "moe_tokens_e3": 1.0}
    assert router_figures(per_layer, per_expert=False) == {"moe_imbalance": 3.0}


@pytest.mark.parametrize(
    ("balancing", "coeff", "names"),
    [
        ("aux_loss", 0.01, ["load_balancing_loss"]),
        ("aux_loss", 0.0, []),
        ("none", 0.0, []),
        (["aux_loss", "seq_aux_loss"], [0.0, 0.1], ["seq_load_balancing_loss"]),
    ],
)
def test_the_load_balancing_losses_read_are_the_ones_megatron_computes(balancing, coeff, names):
    config = SimpleNamespace(moe_router_load_balancing_type=balancing, moe_aux_loss_coeff=coeff)
    assert tracked_loss_names(config) == names


def test_plugin_figures_reach_the_metrics_record_and_the_log_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    reporter = RunReporter(tmp_path, total_steps=1, log_interval=1, progress_bar=False)
    metrics = StepMetrics(step=1, loss=2.0, lr=0.1, grad_norm=1.0, loss_tokens=8, step_time_s=1,
                          extra={"moe_load_balancing_loss": 1.0234, "moe_imbalance": 1.5})
    reporter.step(metrics, total_steps=1)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["extra"] == {"moe_load_balancing_loss": 1.0234, "moe_imbalance": 1.5}
    assert "s/step | moe_load_balancing_loss 1.023 | moe_imbalance 1.5" in capsys.readouterr().out


def test_the_plugin_is_built_exactly_for_models_with_experts():
    """No switch to keep in step: every recipe with experts reports its routers, none without."""
    moe_recipes = 0
    for name in RECIPES:
        cfg = get_recipe(name)
        built = [plugin for plugin in build_plugins(cfg) if isinstance(plugin, MoePlugin)]
        experts = cfg.model.num_moe_experts is not None
        assert [plugin.name for plugin in built] == (["moe"] if experts else []), name
        moe_recipes += experts
    assert 0 < moe_recipes < len(RECIPES)  # both kinds were seen


def test_tiny_moe_layouts_train_the_same_model_on_the_same_batch():
    reference = get_recipe("mixtral_tiny_ep1")
    assert len(TINY_MOE) >= 5
    for name in TINY_MOE:
        cfg = get_recipe(name)
        assert cfg.model == reference.model, name
        assert cfg.layout.padded_vocab == reference.layout.padded_vocab, name
        assert (cfg.train, cfg.data, cfg.scheduler, cfg.precision, cfg.plugins) == (
            reference.train, reference.data, reference.scheduler, reference.precision,
            reference.plugins,
        ), name
    m = reference.model
    assert (m.num_layers, m.hidden_size, m.num_moe_experts, m.moe_router_topk) == (4, 64, 4, 2)
    assert (m.seq_length, m.vocab_size, m.activation) == (128, 256, "swiglu")


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo world with Megatron's process groups, torn down after the test."""
    from megatron.core import parallel_state

    from trainer.mcore_translation import initialize_parallel_state

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                                         rank=0, world_size=1)
    try:
        initialize_parallel_state(get_recipe("mixtral_tiny_ep1").layout)
        yield tmp_path
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def test_router_figures_are_gathered_at_the_log_interval_only(one_rank, monkeypatch):
    """No collective and no figure on the steps between log lines; on a logged step the tokens
    per expert are the mean per step since the last one, the imbalance that of their sum; the
    last step is always gathered."""
    from plugins.moe import plugin as moe_plugin
    from plugins.protocol.events import RunStart

    reductions = []
    real = torch.distributed.all_reduce
    monkeypatch.setattr(moe_plugin.torch.distributed, "all_reduce",
                        lambda tensor, *a, **k: (reductions.append(1), real(tensor, *a, **k))[1])
    from plugins.protocol.events import RuntimeContext

    plugin = MoePlugin(MoeConfig())
    plugin.setup_runtime(RuntimeContext(backend="gloo", device="cpu"))
    plugin.model_config = SimpleNamespace(
        num_layers=1, num_moe_experts=2, sequence_parallel=False, mtp_num_layers=None,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.0)
    cfg = get_recipe("mixtral_tiny_ep1")
    cfg.logging.log_interval = 2
    plugin.run_start(RunStart(cfg, one_rank, 0, 5))
    routed = [[3.0, 1.0], [1.0, 5.0], [2.0, 2.0], [4.0, 0.0], [0.0, 4.0]]
    figures = {}
    for step, tokens in enumerate(routed, start=1):
        counts = plugin.counter.counts
        plugin.counter.counts = (torch.zeros(1, 2, dtype=torch.float64) if counts is None
                                 else counts) + torch.tensor([tokens], dtype=torch.float64)
        metrics = StepMetrics(step=step, loss=1.0, lr=1e-3, grad_norm=1.0, loss_tokens=8,
                              step_time_s=0.1)
        plugin.after_step(metrics)
        figures[step] = metrics.extra
    assert [step for step, extra in figures.items() if extra] == [2, 4, 5]
    assert len(reductions) == 3  # one count reduction per logged step, none between
    assert (figures[2]["moe_tokens_e0"], figures[2]["moe_tokens_e1"]) == (2.0, 3.0)
    assert figures[2]["moe_imbalance"] == pytest.approx(6 / 5)  # max 6 of 4 + 6 tokens
    assert (figures[4]["moe_tokens_e0"], figures[4]["moe_tokens_e1"]) == (3.0, 1.0)
    assert (figures[5]["moe_tokens_e0"], figures[5]["moe_tokens_e1"]) == (0.0, 4.0)

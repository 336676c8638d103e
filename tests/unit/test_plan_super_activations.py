"""The planner's activations of Nemotron 3 Super's two features: MTP depths are held on the last
pipeline stage only, one depth's layers, projection and logits per depth; a latent MoE routes
latent-wide copies and keeps the inputs of its two latent projections. Under full recompute an
MTP depth keeps only its checkpoint's two inputs, and one depth is rebuilt at a time."""

from __future__ import annotations

import copy

import pytest

from recipes.plan.activations import layer_bytes, output_bytes, stage_activations
from recipes.registry import get_recipe


def _with_depths(name: str, depths: int):
    cfg = copy.deepcopy(get_recipe(name))
    main = cfg.model.hybrid_layer_pattern.split("/")[0]
    cfg.model.hybrid_layer_pattern = main + "/*E" * depths
    return cfg


@pytest.mark.parametrize("name", ["super_tiny_dp1", "super_tiny_pp2", "super_tiny_pp2_vpp2"])
def test_mtp_depths_are_held_on_the_last_stage_only_one_depth_at_a_time(name):
    none, one, two = (stage_activations(_with_depths(name, d), "flash", te_layers=True)
                      for d in (0, 1, 2))
    assert [s.mtp for s in none] == [0.0] * len(none)
    assert [s.mtp for s in one[:-1]] == [s.mtp for s in two[:-1]] == [0.0] * (len(one) - 1)
    assert two[-1].mtp == pytest.approx(2 * one[-1].mtp) and one[-1].mtp > 0
    for a, b in zip(none, two, strict=True):  # nothing else moves
        assert b.total - b.mtp == pytest.approx(a.total)


def test_each_mtp_depth_keeps_its_layers_projection_and_a_heads_logits():
    cfg = _with_depths("super_tiny_dp1", 1)
    [stage] = stage_activations(cfg, "flash", te_layers=True)
    layers = layer_bytes(cfg, "flash", symbol="*") + layer_bytes(cfg, "flash", symbol="E")
    d, tokens = 2 if cfg.precision.dtype == "bf16" else 4, (
        cfg.train.micro_batch_size * cfg.model.seq_length)
    projection = tokens * 4 * d * cfg.model.hidden_size  # the 2h-wide input, its two norms
    assert stage.mtp == pytest.approx((layers + projection) * stage.in_flight + output_bytes(cfg))


def test_a_latent_moe_routes_latent_wide_copies_and_keeps_the_projections_inputs():
    latent = get_recipe("super_tiny_dp1")
    full = copy.deepcopy(latent)
    full.model.moe_latent_size = None
    m, d = latent.model, 2 if latent.precision.dtype == "bf16" else 4
    h, x, k = m.hidden_size, m.moe_latent_size, m.moe_router_topk
    tokens = latent.train.micro_batch_size * m.seq_length
    # Each routed copy reads and writes x wide instead of h; the two projections keep h + x.
    expected = tokens * (k * 2 * d * (x - h) + d * (h + x))
    saved = layer_bytes(latent, "flash", symbol="E") - layer_bytes(full, "flash", symbol="E")
    assert saved == pytest.approx(expected)
    assert layer_bytes(latent, "flash", symbol="E") < layer_bytes(full, "flash", symbol="E")


def _full_recompute(name: str):
    cfg = copy.deepcopy(get_recipe(name))
    cfg.train.recompute = "full"
    return cfg


@pytest.mark.parametrize("name", ["super_tiny_dp1", "super_tiny_tp2_sp", "super_tiny_pp2"])
def test_full_recompute_keeps_each_mtp_depths_two_inputs_and_its_logits(name):
    """Under full recompute a depth runs inside one checkpoint that saves its two inputs (the
    hidden states and the token embeddings); its output-layer input and logits stay."""
    cfg = _full_recompute(name)
    last = stage_activations(cfg, "flash", te_layers=True)[-1]
    m, layout = cfg.model, cfg.layout
    d, split = 2 if cfg.precision.dtype == "bf16" else 4, (
        layout.tensor if layout.sequence_parallel else 1)
    tokens = cfg.train.micro_batch_size * m.seq_length // layout.context
    hidden = tokens * d * m.hidden_size / split
    logits = tokens * 4 * layout.padded_vocab / layout.tensor
    assert last.mtp == pytest.approx(2 * 2 * hidden * last.in_flight + 2 * (hidden + logits))


@pytest.mark.parametrize("name", ["super_tiny_dp1", "super_tiny_tp2_sp"])
def test_full_recompute_rebuilds_one_mtp_depth_or_one_decoder_layer_at_a_time(name):
    """One depth rebuilt holds its projection's 2h input, its two layers' checkpointed inputs,
    its final norm's input and its largest layer in full; the decoder's blocks are rebuilt after
    every head's backward, so each is its own field and the peak holds the larger phase."""
    cfg = _full_recompute(name)
    [stage] = stage_activations(cfg, "flash", te_layers=True)
    m, layout = cfg.model, cfg.layout
    d, split = 2 if cfg.precision.dtype == "bf16" else 4, (
        layout.tensor if layout.sequence_parallel else 1)
    hidden = cfg.train.micro_batch_size * m.seq_length * d * m.hidden_size / split
    depth = (2 + 2 + 1) * hidden + max(layer_bytes(cfg, "flash", symbol=s) for s in "*E")
    decoder = max(layer_bytes(cfg, "flash", symbol=s) for s in "ME*")
    assert stage.mtp_rebuild == pytest.approx(depth)
    assert stage.recompute_working == pytest.approx(decoder)
    assert depth > decoder  # the tiny Super's MoE is its largest layer: the depth is larger
    assert stage.total == pytest.approx(stage.layers_total + stage.embedding + stage.cuda_graphs
                                        + max(decoder, stage.output + stage.mtp + depth))


"""The step model's collective counts are the communication table's, counted from each stage's
layers by kind (`params.stage_kinds`): a hybrid layer is one sublayer for TP, only MoE layers
exchange tokens over EP, only attention layers pass K/V round the CP ring and Mamba layers
start their six all-to-alls."""

from __future__ import annotations

from recipes.models import kinds
from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.params import stage_kinds
from recipes.plan.steptime import collective_counts
from recipes.resolve import resolve_config

H100 = "conf/cluster/h100_80gb_8x8.yaml"


def _counts(recipe: str, *overrides):
    cfg = resolve_config([f"recipe={recipe}", *overrides])
    (stage,) = stage_plans(cfg, load_cluster(H100), PlanOptions(listed_groups=0))
    return cfg, stage_kinds(cfg)[0], collective_counts(stage)


def test_nemotron3_nano_counts_its_sublayers_and_moe_layers():
    cfg, layers, counts = _counts("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16")
    micro = cfg.layout.microbatches
    assert (layers[kinds.MAMBA], layers[kinds.ATTENTION], layers[kinds.MOE], micro) == (
        23, 6, 23, 96)
    # SP: an all-gather and a reduce-scatter forward and backward, per layer (one sublayer, an
    # MoE layer's its shared experts); each layer's column-parallel backward (in_proj, QKV,
    # the shared experts' FC1) gathers its input again; then the output layer's gather,
    # re-gather and reduce-scatter, and the fused loss's two all-reduces (TE ranks), once per
    # micro-batch; expert TP 1: the dispatcher sends nothing over expert TP
    assert counts["tp"] == 2 * 2 * 52 * 96 + 52 * 96 + (3 + 2) * 96 == 25_440
    assert cfg.layout.expert_tensor_size == 1 and counts["expert-tp"] == 0
    # selective recompute of `moe` dispatches and combines again: 6 per MoE layer
    assert cfg.train.recompute_modules == ["moe", "layernorm"]
    assert counts["ep"] == 6 * 23 * 96
    _, _, plain = _counts("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16", "train.recompute=none",
                          "train.recompute_modules=[core_attn]")
    assert plain["ep"] == 4 * 23 * 96 == 8_832


def test_hybrid_cp_counts_ring_steps_in_attention_layers_and_all_to_alls_in_mamba():
    cfg, layers, counts = _counts("hybrid_tiny_tp2_sp", "parallel.context=2",
                                  "parallel.tensor=1", "parallel.sequence_parallel=false")
    micro, cp = cfg.layout.microbatches, cfg.layout.context
    assert layers[kinds.ATTENTION] < sum(layers.values())
    assert counts["cp"] == micro * (3 * (cp - 1) * layers[kinds.ATTENTION]
                                    + 2 * 6 * layers[kinds.MAMBA])

"""The planner's traffic and step model for Nemotron 3 Super's shape: on the last stage each MTP
depth's layers send their kinds' TP and CP collectives and its input projection its own TP
gathers, an MTP layer rerun twice under full recompute; the step model's products add up to the
one FLOPs definition (`recipes/plan/flops.py`: Mamba layers, latent experts, MTP projections
and logits included), time a latent MoE's routed experts at the latent width, and put the MTP
depths' time on the last stage alone, time each stage by the layer kinds it holds, hide the CP
ring behind the attention cores but not Mamba's CP all-to-alls; a 1M-token plan says how much
of the MTP depths' memory is their FP32 logits (as docs/planner.md quotes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recipes.models.gpt.flops import attention_score_flops, logits_flops
from recipes.models.hybrid import pattern as hybrid
from recipes.plan.activations import mtp_logits_bytes
from recipes.plan.build import PlanOptions, make_plan, stage_plans
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.comm import KV_RING, OUTPUT_LAYERS
from recipes.plan.fit import refusal
from recipes.plan.flops import FlopsShape, forward_flops_per_token
from recipes.plan.steptime import (
    collective_counts,
    kind_forward_seconds,
    layer_gemms,
    step_time,
)
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
CPU = "conf/cluster/cpu_local.yaml"
H100 = "conf/cluster/h100_80gb_8x8.yaml"
TINY_TP = "super_tiny_tp2_sp"  # MEM*EME/*E/*E on TP2 + SP, one stage
TINY_PP = "super_tiny_pp2"  # MEM* | EME, the MTP depths on the last stage
SUPER = "nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"
PEAK = 100.0  # TFLOP/s: at a peak fraction of 1 and no half dimension, seconds are FLOPs / peak


def _config(recipe: str, *overrides: str):
    return resolve_config([f"recipe={recipe}", *overrides])


def _group(recipe: str, group: str, *overrides: str, operation: str | None = None,
           skip: str | None = None) -> list[tuple[float, float]]:
    """(bytes, collectives) one rank of each stage sends in `group`'s rows (of `operation`; not
    of `skip`)."""
    stages = stage_plans(_config(recipe, *overrides), load_cluster(CPU),
                         PlanOptions(listed_groups=0))
    rows = [[t for t in s.traffic if t.group == group and operation in (None, t.operation)
             and t.operation != skip] for s in stages]
    return [(sum(t.bytes_sent for t in r), sum(t.collectives for t in r)) for r in rows]


def _depths(main: str, depths: int) -> tuple[str, ...]:
    """The overrides for `main` with `depths` MTP depths (none: without the MTP settings)."""
    pattern = f"model.hybrid_layer_pattern={main}" + "/*E" * depths
    if depths:
        return (pattern,)
    return pattern, "model.mtp_loss_scaling_factor=0.1", "model.mtp_use_repeated_layer=false"


def _hidden_states(recipe: str, *overrides: str) -> tuple[int, float]:
    """(micro-batches, ring x B): what one TP rank sends of a micro-batch's hidden states B in a
    ring all-gather or reduce-scatter, (n-1)/n of them."""
    cfg = _config(recipe, *overrides)
    layout, m = cfg.layout, cfg.model
    tokens = cfg.train.micro_batch_size * m.seq_length / layout.context
    size = tokens * m.hidden_size * {"fp32": 4, "bf16": 2}[cfg.precision.dtype]
    return layout.microbatches, (layout.tensor - 1) / layout.tensor * size


def test_each_mtp_depth_sends_its_layers_and_its_projections_tp_collectives():
    """MEM*EME on TP2 + SP: each of its 7 sublayers (an E through its shared experts, a
    TP-split MLP) gathers and reduce-scatters forward and backward (4 x ring x B, 4
    collectives), and the backward of each, column-parallel first (M's in_proj, *'s QKV, E's
    shared FC1), gathers its input again for the weight gradient (ring x B, 1). A `*E` depth
    adds 2 such sublayers and its projection, whose forward gathers a 2·hidden-wide input and a
    hidden-wide output (3 x ring x B, 2) and whose backward reduce-scatters the input's
    gradient, gathers the input again (2·hidden wide each) and gathers the output's gradient
    (5 x ring x B, 3)."""
    (none, none_started), (one, one_started), (two, two_started) = (
        _group(TINY_TP, "tp", *_depths("MEM*EME", d), skip=OUTPUT_LAYERS)[0] for d in (0, 1, 2))
    micro, rb = _hidden_states(TINY_TP)
    assert none == pytest.approx(micro * (7 * 4 + 7) * rb) and none_started == micro * 35
    depth, depth_started = 2 * 4 + 2 + 3 + 5, 2 * 4 + 2 + 2 + 3
    assert one - none == pytest.approx(two - one) == pytest.approx(micro * depth * rb)
    assert one_started - none_started == two_started - one_started == micro * depth_started


def test_only_the_last_stage_sends_the_mtp_depths_tp_collectives():
    tp = ("parallel.tensor=2", "parallel.sequence_parallel=true", "cluster.gpus_per_node=4")
    none = _group(TINY_PP, "tp", *tp, *_depths("MEM*|EME", 0))
    two = _group(TINY_PP, "tp", *tp, *_depths("MEM*|EME", 2))
    assert two[0] == none[0] and none[0][0] > 0
    assert two[1][0] > none[1][0] and two[1][1] > none[1][1]


def test_each_mtp_depth_passes_its_k_v_round_the_cp_ring():
    """MEM*EME has one attention layer; each `*E` depth runs one more."""
    cp = ("parallel.context=2", "cluster.gpus_per_node=2")
    rings = [_group("super_tiny_dp1", "cp", *cp, *_depths("MEM*EME", d),
                    operation="K/V ring exchange")[0] for d in (0, 1, 2)]
    assert rings[0][0] > 0
    assert [sent / rings[0][0] for sent, _ in rings] == pytest.approx([1, 2, 3])
    assert [started / rings[0][1] for _, started in rings] == [1, 2, 3]


def test_full_recompute_reruns_an_mtp_layers_collectives_twice():
    """A depth runs in one checkpoint whose rerun checkpoints each of its layers again: a
    decoder MoE layer's 4 all-to-alls become 6, an MTP one's 8; a decoder sublayer's TP passes
    (SP: a gather and a reduce-scatter, 2 x ring x B) 2 become 3, an MTP one's 4, while each
    sublayer's column-parallel backward still gathers its input again once (ring x B); the
    projection's
    forward (3 x ring x B) reruns once, its backward (5 x ring x B) does not."""
    full = "train.recompute=full"
    [(decoder, _)] = _group("super_tiny_ep2_dp2", "ep", full, *_depths("MEM*EME", 0))
    [(with_one, _)] = _group("super_tiny_ep2_dp2", "ep", full, *_depths("MEM*EME", 1))
    assert (with_one - decoder) / (decoder / 3) == pytest.approx(8 / 6)  # 3 MoE layers
    [(none, _)] = _group(TINY_TP, "tp", full, *_depths("MEM*EME", 0), skip=OUTPUT_LAYERS)
    [(one, _)] = _group(TINY_TP, "tp", full, *_depths("MEM*EME", 1), skip=OUTPUT_LAYERS)
    micro, rb = _hidden_states(TINY_TP, full)
    assert none == pytest.approx(micro * (7 * 3 * 2 + 7) * rb)
    assert one - none == pytest.approx(micro * (2 * 4 * 2 + 2 + 2 * 3 + 5) * rb)


def _forward_flops_per_rank(cfg) -> float:
    """One micro-batch's forward FLOPs on one rank, from the FLOPs definition alone."""
    s, layout, m = FlopsShape.from_config(cfg), cfg.layout, cfg.model
    tokens = layout.micro_batch * m.seq_length / layout.context
    pairs = layout.micro_batch * m.seq_length ** 2 / 2 / layout.context
    return (tokens * forward_flops_per_token(s) + attention_score_flops(s, pairs)) / layout.tensor


def _compute(cfg, cluster: str) -> float:
    """The step model's compute at a peak fraction of 1 and no half dimension: FLOPs / peak."""
    stages = stage_plans(cfg, load_cluster(cluster), PlanOptions(listed_groups=0))
    return step_time(cfg, stages, PEAK, peak_fraction=1.0, half_dim=0.0).compute


@pytest.mark.parametrize(("recipe", "cluster"), [
    (SUPER, H100), ("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16", H100),
    ("nemotron_h_8b_tp2_sp_dp32", H100), ("super_tiny_dp1", CPU),
    ("llama3_8b_tp8_dp8", H100), ("mixtral_tiny_ep4_dp4", CPU)])
def test_the_step_models_products_add_up_to_the_flops_definition(recipe, cluster):
    """One stage, no recompute: the step's compute is forward and backward (3 forwards) of
    every micro-batch of the model's FLOPs: Mamba layers, latent experts and their projections,
    shared experts, MTP depths' layers, projections and logits all counted."""
    cfg = _config(recipe, "train.recompute=none", "train.recompute_modules=[core_attn]")
    assert cfg.layout.pipeline == 1
    expected = cfg.layout.microbatches * 3 * _forward_flops_per_rank(cfg) / (PEAK * 1e12)
    assert _compute(cfg, cluster) == pytest.approx(expected, rel=1e-9)


def test_the_mtp_depths_time_is_the_last_stages_alone():
    """ME | M*EME: the two MTP depths' FLOPs (the model's with them less the model's without)
    lengthen the last stage, the slowest, by all of their time; the decoder's layer kinds, which
    the stages sum, do not change."""
    with_mtp = _config(TINY_PP, "train.recompute=none", *_depths("ME|M*EME", 2))
    without = _config(TINY_PP, "train.recompute=none", *_depths("ME|M*EME", 0))
    mtp = _forward_flops_per_rank(with_mtp) - _forward_flops_per_rank(without)
    assert mtp > 0
    micro = with_mtp.layout.microbatches
    grown = _compute(with_mtp, CPU) - _compute(without, CPU)
    assert grown == pytest.approx(micro * 3 * mtp / (PEAK * 1e12), rel=1e-9)
    assert (kind_forward_seconds(with_mtp, 1e14, 0.75, 64.0)
            == kind_forward_seconds(without, 1e14, 0.75, 64.0))


def test_a_latent_moes_routed_experts_are_timed_at_the_latent_width():
    """Super (hidden 4096, latent 1024): the routed experts' product reads latent-wide copies,
    each local expert fed top-k copies of its EP group's tokens (tokens / TP each under SP);
    the latent projections run at the model width into the latent one."""
    cfg = _config(SUPER)
    m, layout = cfg.model, cfg.layout
    gemms, _ = layer_gemms(cfg)
    tokens = layout.micro_batch * m.seq_length / layout.context
    copies = tokens / layout.tensor * m.moe_router_topk * layout.expert / m.num_moe_experts
    assert [g.k for g in gemms if g.m == pytest.approx(copies)] == [m.moe_latent_size]
    projections = [g for g in gemms if (g.k, g.n) == (m.hidden_size, m.moe_latent_size)]
    assert [g.m for g in projections] == [tokens / layout.tensor]


def test_a_1m_token_plan_names_the_mtp_depths_fp32_logits():
    """Super's 1M-token stage at TP4 x CP16: each of the 2 MTP depths keeps its own FP32 logits,
    2^20 / 16 tokens x 131,072 / 4 vocabulary entries x 4 bytes, and the refusal says so."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(resolve_config([
        "recipe=nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16", "phases=[]",
        "data.blend=conf/data/nemotron3_super_long_context.yaml", "train.global_batch_size=16",
        "model.seq_length=1048576", "data.documents=concatenate", "train.micro_batch_size=1",
        "parallel.context=16"]), cluster)
    depths = hybrid.mtp_depths(cfg.model.hybrid_layer_pattern)
    logits = depths * 2**20 / 16 * cfg.layout.padded_vocab / 4 * 4
    assert mtp_logits_bytes(cfg) == logits
    plan = make_plan(cfg, cluster, PlanOptions(listed_groups=0))
    assert not plan.fits and plan.worst.activations.mtp > logits
    assert f"({logits / 1e9:.2f} GB of it their FP32 logits)" in refusal(plan)
    page = " ".join((REPO / "docs" / "planner.md").read_text(encoding="utf-8").split())
    mtp = plan.worst.activations.mtp
    assert f"at Super's 1M tokens a rank, {logits / 1e9:.2f} of {mtp / 1e9:.2f} GB" in page


def test_the_cp_ring_hides_behind_attention_cores_and_mambas_all_to_alls_do_not():
    """Super's 1M-token stage in NVIDIA's TP2 x CP64 layout: the attention cores are long
    enough to hide the K/V ring whole, while the Mamba layers' all-to-alls, which Megatron waits
    on around each conv and scan, stay in the step's CP term, with their latency."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(_config(SUPER, "model.seq_length=1048576", "train.global_batch_size=16",
                                "parallel.tensor=2", "parallel.context=64", "cluster.nodes=16"),
                        cluster)
    [stage] = stage_plans(cfg, cluster, PlanOptions(listed_groups=0))
    seconds = {t.operation: t.seconds for t in stage.traffic if t.group == "cp"}
    assert seconds[KV_RING] > 0
    latency = 1e-5
    step = step_time(cfg, [stage], 1000.0, latency_s=latency)
    waits = collective_counts(stage)["cp"] * latency
    assert step.cp == pytest.approx(seconds["Mamba all-to-all"] + waits, rel=1e-9)


def _stage_forward_flops(cfg, counts: dict[str, int], last: bool) -> float:
    """One micro-batch's forward FLOPs on one rank of a stage holding the layers `counts`
    names by kind (and, on the last stage, the logits), from the FLOPs definition alone."""
    s = dataclasses.replace(FlopsShape.from_config(cfg), attention_layers=counts.get("*", 0),
                            dense_mlp_layers=0, moe_layers=counts.get("E", 0),
                            mamba_layers=counts.get("M", 0), mtp_depths=0)
    layout, m = cfg.layout, cfg.model
    tokens = layout.micro_batch * m.seq_length / layout.context
    pairs = layout.micro_batch * m.seq_length ** 2 / 2 / layout.context
    per_token = forward_flops_per_token(s) - (0 if last else logits_flops(s))
    return (tokens * per_token + attention_score_flops(s, pairs)) / layout.tensor


@pytest.mark.parametrize("pattern", ["MEM*|EME", "M*M*|EEE", "EEEE|M*M"])
def test_each_stage_is_timed_by_the_layer_kinds_it_holds(pattern):
    """A hybrid's stages hold different kinds (`|` splits the pattern): the step's compute is
    the slowest stage's own layers (and the last one's logits), not its layer count times the
    model's mean layer."""
    cfg = _config(TINY_PP, "train.recompute=none", *_depths(pattern, 0))
    stages = [{kind: part.count(kind) for kind in "M*E"} for part in pattern.split("|")]
    slowest = max(_stage_forward_flops(cfg, counts, last=i == len(stages) - 1)
                  for i, counts in enumerate(stages))
    expected = cfg.layout.microbatches * 3 * slowest / (PEAK * 1e12)
    assert _compute(cfg, CPU) == pytest.approx(expected, rel=1e-9)

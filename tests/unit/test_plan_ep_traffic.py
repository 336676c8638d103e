"""The planner's EP traffic counts every MoE pass at the width its tokens cross the EP group at:
a latent MoE (`model.moe_latent_size`) dispatches and combines latent-wide tokens (Megatron
projects them down before the dispatch), and on the last stage each MTP depth runs its MoE
layers once more, shared weights or not, as the FLOPs count them. The step model's EP
latency reads the same count (`steptime.collective_counts`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.comm import moe_passes
from recipes.plan.fit import size_text
from recipes.plan.flops import FlopsShape
from recipes.plan.params import stage_kinds
from recipes.plan.steptime import collective_counts
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
CPU = "conf/cluster/cpu_local.yaml"
H100 = "conf/cluster/h100_80gb_8x8.yaml"
SUPER = "nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"
TINY_EP = "super_tiny_ep2_dp2"  # MEM*EME/*E/*E, latent 32 of 64, EP2
TINY_PP_EP = "super_tiny_tp2_sp_pp2_ep2"  # MEM* | EME, the MTP depths on the last stage


def _ep(recipe: str, *overrides: str, cluster: str = CPU) -> list[tuple[float, float]]:
    """(EP bytes, EP collectives the step model counts) of one rank of each stage."""
    cfg = resolve_config([f"recipe={recipe}", *overrides])
    stages = stage_plans(cfg, load_cluster(cluster), PlanOptions(listed_groups=0))
    return [(sum(t.bytes_sent for t in s.traffic if t.group == "ep"),
             collective_counts(s)["ep"]) for s in stages]


@pytest.mark.parametrize(("recipe", "cluster"), [(TINY_EP, CPU), (SUPER, H100)])
def test_a_latent_moe_exchanges_latent_wide_tokens(recipe, cluster):
    cfg = resolve_config([f"recipe={recipe}"])
    latent, hidden = cfg.model.moe_latent_size, cfg.model.hidden_size
    [(sent, started)] = _ep(recipe, cluster=cluster)
    [(half, half_started)] = _ep(recipe, f"model.moe_latent_size={latent // 2}", cluster=cluster)
    [(wide, wide_started)] = _ep(recipe, "model.moe_latent_size=null", cluster=cluster)
    assert sent > 0
    assert half == pytest.approx(sent / 2)
    assert wide == pytest.approx(sent * hidden / latent)  # d / l more without the latent space
    assert started == half_started == wide_started  # the same dispatches, narrower


@pytest.mark.parametrize("repeated", ["true", "false"])
def test_each_mtp_depth_runs_its_moe_layers_shared_or_not(repeated):
    """MEM*EME has 3 MoE layers; each `*E` depth adds one more dispatch and combine."""
    shared = f"model.mtp_use_repeated_layer={repeated}"
    [(one, one_started)] = _ep(TINY_EP, "model.hybrid_layer_pattern=MEM*EME/*E", shared)
    [(two, two_started)] = _ep(TINY_EP, "model.hybrid_layer_pattern=MEM*EME/*E/*E", shared)
    assert two == pytest.approx(one * 5 / 4)
    assert two_started == one_started * 5 / 4
    cfg = resolve_config([f"recipe={TINY_EP}", shared])
    assert cfg.train.recompute == "none"
    # dispatch and combine, forward and backward, per MoE pass and micro-batch
    assert two_started == 4 * (3 + 2) * cfg.layout.microbatches


def test_only_the_last_stage_runs_the_mtp_moe_layers():
    one = _ep(TINY_PP_EP, "model.hybrid_layer_pattern=ME|M*EME/*E")
    two = _ep(TINY_PP_EP, "model.hybrid_layer_pattern=ME|M*EME/*E/*E")
    assert one[0] == two[0] and one[0][0] > 0  # ME: its own MoE layer, no MTP depth
    assert two[1][0] == pytest.approx(one[1][0] * 4 / 3)  # M*EME + 2 depths over M*EME + 1
    assert two[1][1] == one[1][1] * 4 / 3
    assert two[1][1] == 4 * two[0][1]  # 2 + 2 MoE passes against the first stage's 1


@pytest.mark.parametrize("recipe", [SUPER, TINY_EP, TINY_PP_EP, "super_tiny_pp2_vpp2",
                                    "nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16",
                                    "mixtral_tiny_ep4_dp4"])
def test_the_moe_passes_are_the_flops_moe_layers(recipe):
    """One count: the stages' MoE passes add up to the MoE layers the FLOPs count."""
    cfg = resolve_config([f"recipe={recipe}"])
    passes = sum(moe_passes(cfg, stage, counts) for stage, counts in enumerate(stage_kinds(cfg)))
    assert passes == FlopsShape.from_config(cfg).moe_layers > 0


def test_the_moe_page_quotes_supers_ep_traffic():
    """docs/moe.md's figures are a fresh plan's (the page reflowed to one line)."""
    page = " ".join((REPO / "docs" / "moe.md").read_text(encoding="utf-8").split())
    [(latent, _)] = _ep(SUPER, cluster=H100)
    [(wide, _)] = _ep(SUPER, "model.moe_latent_size=null", cluster=H100)
    quoted = (f"sends {size_text(latent)} of EP all-to-all a rank per step (40 decoder and 2 MTP "
              f"MoE passes); with `model.moe_latent_size=null`, {size_text(wide)}.")
    assert quoted in page


def _allgather_rows(*overrides: str):
    cfg = resolve_config(["recipe=mixtral_tiny_ep2_dp2", "model.moe_token_dispatcher=allgather",
                          *overrides])
    (stage,) = stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0))
    return cfg, stage, [t for t in stage.traffic if t.group in ("ep", "expert-tp")]


@pytest.mark.parametrize("overrides", [
    (), ("precision.dtype=bf16",), ("precision.dtype=bf16", "model.moe_router_fp32=true"),
    ("parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.expert_tensor=null",
     "cluster.gpus_per_node=8"),
    ("train.recompute=selective", "train.recompute_modules=[moe]"),
])
def test_the_allgather_dispatcher_gathers_every_token_of_its_group(overrides):
    """`MoEAllGatherTokenDispatcher`: each rank gathers the routing map (a bool per expert),
    the probabilities and the hidden states of every token its expert-TP x EP peers hold
    (tokens / TP each), and reduce-scatters the output in the probabilities' dtype; the
    backward reduce-scatters the hidden states' and probabilities' gradients and gathers the
    combine's. One row, no all-to-all and no separate expert-TP collectives."""
    cfg, stage, rows = _allgather_rows(*overrides)
    layout, m = cfg.layout, cfg.model
    (row,) = rows
    assert row.group == "ep" and row.operation == "token all-gather + reduce-scatter"
    d = {"fp32": 4, "bf16": 2}[cfg.precision.dtype]
    p = 4 if m.moe_router_fp32 else d  # probabilities: the router's dtype
    assert layout.expert_tensor_size == (2 if "parallel.tensor=2" in overrides else 1)
    others = cfg.train.micro_batch_size * m.seq_length / layout.tensor * (
        layout.expert_tensor_size * layout.expert - 1)
    h, e = m.hidden_size, m.num_moe_experts
    forward = others * (e + e * p + h * d + h * p)
    backward = others * (h * d + e * p + h * p)
    forwards = 2 if "train.recompute_modules=[moe]" in overrides else 1
    per_layer = forwards * forward + backward
    assert row.bytes_sent == pytest.approx(layout.microbatches * m.num_layers * per_layer)
    assert row.collectives == layout.microbatches * m.num_layers * (4 * forwards + 3)


def test_the_allgather_dispatcher_sends_more_than_the_exchange_at_top_2_of_4():
    """At EP2 with top-2 of 4 experts the exchange sends each token's two copies half the time;
    the gather takes every peer token whole, and the routing figures besides."""
    _, _, [gathered] = _allgather_rows()
    cfg = resolve_config(["recipe=mixtral_tiny_ep2_dp2"])
    (stage,) = stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0))
    [exchanged] = [t for t in stage.traffic if t.group == "ep"]
    assert exchanged.operation == "all-to-all"
    assert gathered.bytes_sent > exchanged.bytes_sent

"""A fully recomputed layer runs its forward again in the backward, with the collectives inside
it (`comm.recomputed`): its TP all-reduces, its K/V round the CP ring (four passes where three
were) and its MoE dispatch and combine (six all-to-alls where four were), in the table's bytes
and in the step model's counts alike."""

from __future__ import annotations

import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.steptime import collective_counts
from recipes.resolve import resolve_config

CPU = "conf/cluster/cpu_local.yaml"
MOE_CP = ["recipe=mixtral_tiny_ep4_dp4", "parallel.context=2"]


def _stage(*overrides):
    cfg = resolve_config([*MOE_CP, *overrides])
    (stage,) = stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0))
    sent = {}
    for t in stage.traffic:
        sent[t.group] = sent.get(t.group, 0.0) + t.bytes_sent
    return sent, collective_counts(stage)


def test_full_recompute_repeats_the_ring_and_the_token_exchange():
    none_sent, none_counts = _stage()
    full_sent, full_counts = _stage("train.recompute=full")
    assert none_sent["cp"] > 0 and none_sent["ep"] > 0
    assert full_sent["cp"] == pytest.approx(none_sent["cp"] * 4 / 3)
    assert full_counts["cp"] == none_counts["cp"] * 4 / 3
    assert full_sent["ep"] == pytest.approx(none_sent["ep"] * 6 / 4)
    assert full_counts["ep"] == none_counts["ep"] * 6 / 4


def test_selective_recompute_of_the_moe_layer_repeats_only_its_token_exchange():
    none_sent, none_counts = _stage()
    moe_sent, moe_counts = _stage("train.recompute=selective", "train.recompute_modules=[moe]")
    assert moe_sent["ep"] == pytest.approx(none_sent["ep"] * 6 / 4)
    assert moe_counts["ep"] == none_counts["ep"] * 6 / 4
    assert moe_sent["cp"] == none_sent["cp"] and moe_counts["cp"] == none_counts["cp"]


def test_selective_recompute_of_the_attention_core_repeats_only_its_ring():
    """`core_attn` reruns the attention core in the backward
    (`Attention._checkpointed_attention_forward`), and under CP the core is the ring."""
    none_sent, none_counts = _stage()
    core_sent, core_counts = _stage("train.recompute=selective",
                                    "train.recompute_modules=[core_attn]")
    assert core_sent["cp"] == pytest.approx(none_sent["cp"] * 4 / 3)
    assert core_counts["cp"] == none_counts["cp"] * 4 / 3
    assert core_sent["ep"] == none_sent["ep"] and core_counts["ep"] == none_counts["ep"]

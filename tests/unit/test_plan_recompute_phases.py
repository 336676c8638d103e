"""Under full recompute the last stage's backward has two phases that never coexist: the heads'
(the main head's logits and loss, the MTP depths, one depth rebuilt beside them) and, once every
head's backward has freed its logits, the decoder's block rebuild. The stage's peak is what it
keeps plus the larger phase, and its contributors list that phase alone, named."""

from __future__ import annotations

import copy

import pytest

from recipes.plan.activations import (
    cast_logits_bytes,
    layer_bytes,
    mtp_bytes,
    mtp_rebuild_bytes,
    output_bytes,
    stage_activations,
)
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import CLUSTER_DIR, apply_cluster, load_cluster
from recipes.registry import get_recipe

DECODER_PHASE = "full-recompute block rebuilt (decoder's phase)"
DEPTH_REBUILT = "full-recompute MTP depth rebuilt (heads' phase)"


def _full(name: str, block: int = 1):
    cfg = copy.deepcopy(get_recipe(name))
    cfg.train.recompute, cfg.train.recompute_num_layers = "full", block
    return cfg


def _kept(stage) -> float:
    """What the stage holds through both phases."""
    return stage.layers_total + stage.embedding + stage.cuda_graphs


def _stages(cfg):
    cluster = load_cluster(CLUSTER_DIR / "h100_80gb_8x8.yaml")
    return make_plan(apply_cluster(cfg, cluster), cluster, PlanOptions(listed_groups=0)).stages


@pytest.mark.parametrize("name", ["tiny_dp1", "tiny_pp2"])
def test_a_gpt_last_stage_holds_its_head_or_a_rebuilt_block_not_both(name):
    cfg = _full(name)
    *_, last = stage_activations(cfg, "flash", te_layers=True)
    head = output_bytes(cfg) + cast_logits_bytes(cfg)
    block = layer_bytes(cfg, "flash")  # one layer a block, rebuilt in full
    assert (last.output, last.recompute_working, last.mtp) == (head, block, 0.0)
    assert last.total == pytest.approx(_kept(last) + max(head, block))
    old = _kept(last) + head + block
    assert old - last.total == pytest.approx(min(head, block)) and block > head > 0
    for stage in _stages(cfg):  # every stage, the last too, peaks rebuilding a block
        named = dict(stage.contributors())
        assert sum(named.values()) == pytest.approx(stage.peak)
        assert named[DECODER_PHASE] == pytest.approx(block) and "logits and loss" not in named

def test_the_heads_phase_holds_both_heads_and_one_depth_rebuilt():
    """Tiny Super, one layer a block: the heads' phase (two depths' logits beside the main
    head's, one depth rebuilt) is larger than one decoder block rebuilt."""
    cfg = _full("super_tiny_dp1")
    [stage] = stage_activations(cfg, "flash", te_layers=True)
    kept, logits = mtp_bytes(cfg, "flash")
    heads = (output_bytes(cfg) + cast_logits_bytes(cfg) + kept * stage.in_flight + logits
             + mtp_rebuild_bytes(cfg, "flash"))
    assert heads > stage.recompute_working > 0
    assert stage.total == pytest.approx(_kept(stage) + heads)
    [plan] = _stages(cfg)
    named = dict(plan.contributors())
    assert sum(named.values()) == pytest.approx(plan.peak) and DECODER_PHASE not in named
    assert named[DEPTH_REBUILT] == stage.mtp_rebuild == mtp_rebuild_bytes(cfg, "flash")
    assert (named["logits and loss"], named["MTP depths"]) == (stage.output, stage.mtp)


def test_the_decoder_phase_holds_no_logits_when_its_blocks_are_larger():
    """Tiny Super in blocks of three layers: rebuilding one outweighs the heads' phase, which is
    over by then, so the peak leaves out every head's logits the old sum added on top."""
    cfg = _full("super_tiny_dp1", block=3)
    [stage] = stage_activations(cfg, "flash", te_layers=True)
    block = 3 * max(layer_bytes(cfg, "flash", symbol=s) for s in "ME*")
    assert stage.recompute_working == pytest.approx(block) and block > stage.heads
    assert stage.total == pytest.approx(_kept(stage) + block)
    old = _kept(stage) + stage.output + stage.mtp + max(block, stage.mtp_rebuild)
    assert old - stage.total == pytest.approx(stage.output + stage.mtp)
    [plan] = _stages(cfg)
    named = dict(plan.contributors())
    assert sum(named.values()) == pytest.approx(plan.peak)
    assert named[DECODER_PHASE] == stage.recompute_working
    assert not {"logits and loss", "MTP depths", DEPTH_REBUILT} & set(named)


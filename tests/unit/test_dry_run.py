"""Every registered recipe builds offline: each distinct rank's real model on the meta device.

Checks, per recipe: every rank of the world is accounted for, each pipeline column holds every
layer exactly once, and the shards add up to the same model built unsharded on one rank.
"""

from __future__ import annotations

import pytest

from recipes.registry import RECIPES, get_recipe


@pytest.fixture(scope="module")
def probes(dry_run_probes) -> dict:
    return dry_run_probes  # tests/unit/conftest.py: every recipe dry-run once per session


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_rank_is_built_once(probes, name):
    cfg = get_recipe(name)
    ranks = sorted(rank for shard in probes[name]["shards"] for rank in shard["ranks"])
    assert ranks == list(range(cfg.cluster.world_size))


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_pipeline_column_holds_every_layer_once(probes, name):
    cfg = get_recipe(name)
    columns: dict[tuple[int, int], list[int]] = {}
    for shard in probes[name]["shards"]:
        layers = [layer for chunk in shard["layers"] for layer in chunk]
        columns.setdefault((shard["tp"], shard["ep"]), []).extend(layers)
    for layers in columns.values():
        assert sorted(layers) == list(range(1, cfg.model.num_layers + 1))


@pytest.mark.parametrize("name", list(RECIPES))
def test_shards_add_up_to_the_unsharded_model(probes, name):
    assert probes[name]["total"] == probes[name]["unsharded_total"]


def test_report_names_stages_and_placement(probes):
    report = probes["llama3_8b_tp8_pp4_dp2"]["report"]
    assert "TP8+SP x PP4 x DP2 (64 ranks)" in report
    # Megatron's default order puts DP inside PP: stage 0 on nodes 0 and 1.
    assert "N0:G0-G7 N1:G0-G7" in report


def test_nemotron3_nano_builds_its_published_parameters_on_the_meta_device(probes):
    built = probes["nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16"]
    assert built["total"] == 31_577_937_344  # published 31.6B
    assert built["active"] == 3_580_073_408  # published ~3.6B: top-6 of 128 experts
    assert "active per token 3,580,073,408" in built["report"]


def test_nemotron3_super_builds_its_counted_parameters_on_the_meta_device(probes):
    """Every one of the 64 shards built for real: the planner's total and active counts (with
    the stored MTP depth; tests/unit/test_hybrid_models.py has the published 120.6B / 12.7B)."""
    built = probes["nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"]
    assert built["total"] == 123_611_012_096
    assert built["active"] == 13_015_079_936
    assert "active per token 13,015,079,936" in built["report"]


@pytest.mark.parametrize("name", ["super_tiny_pp2", "super_tiny_pp2_vpp2",
                                  "super_tiny_tp2_sp_pp2_ep2"])
def test_mtp_depths_live_on_the_last_stage_where_the_layout_says(probes, name):
    """The MTP block (one layer, run at two depths) is built on the last stage's last virtual
    stage, as the layout object says; no other shard holds it."""
    from recipes.registry import get_recipe

    layout = get_recipe(name).layout
    stage, _ = layout.mtp_chunk()
    assert stage == layout.pipeline - 1 and layout.mtp_depths == 2
    shards = probes[name]["shards"]
    assert {s["pp"]: s["mtp_layers"] for s in shards} == {0: 0, 1: 1}
    assert "+ MTP 1 x *E run 2 times" in probes[name]["report"]


def test_hybrid_stages_hold_their_pattern_segments(probes):
    shards = probes["hybrid_tiny_pp2_vpp2"]["shards"]  # M* | -M | E | -
    assert {s["pp"]: s["layers"] for s in shards} == {0: [[1, 2], [5]], 1: [[3, 4], [6]]}


def test_a_layout_no_gpu_of_its_cluster_holds_is_refused_before_any_build(monkeypatch):
    # Megatron builds a stage's layers one by one: 1e20 of them never finished, silently.
    from plugins.protocol.errors import ConfigError
    from recipes.config.overrides import apply_overrides
    from trainer.tools import dry_run

    built = []
    monkeypatch.setattr(dry_run, "collect_shards", lambda cfg: built.append(cfg) or [])
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["model.num_layers=99999999999999999999"])
    with pytest.raises(ConfigError) as caught:
        dry_run.run_dry_run(cfg)
    message = str(caught.value)
    assert message.startswith("dry run: the layout needs ") and "\n" not in message
    assert "no machine can hold it" in message and built == []


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_fits_its_cluster_so_its_dry_run_builds(name):
    from trainer.tools.dry_run import check_buildable

    assert isinstance(check_buildable(get_recipe(name)), list)

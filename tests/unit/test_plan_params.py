"""The planner's per-rank parameter counts equal the real Megatron Core model's, exactly.

For every registered recipe the session's dry run (the `dry_run_probes` fixture, a subprocess:
the CPU runtime's patches and fake process groups stay out of the test process) builds each
distinct shard's real model on the meta device and reports what the rank allocates (every
parameter element) and what it adds to the whole model (replicated weights once). Every rank
of every recipe is then checked against `recipes.plan.params`, as exact integers. The shards
are built in the smallest world holding them all (`shard_world`: DP and CP change no rank's
weights), so the 16,384-rank recipes take seconds; the test also checks the layout's shards
are exactly the ones built.
"""

from __future__ import annotations

import pytest

from recipes.plan.params import model_parameters, stage_layer_counts, stage_params
from recipes.registry import RECIPES, get_recipe


@pytest.fixture(scope="module")
def real(dry_run_probes) -> dict:
    """Per recipe, [shard key, what the shard holds] from the session's dry run of every
    recipe (tests/unit/conftest.py)."""
    return {
        name: [[[s["pp"], s["tp"], s["ep"]],
                {"held": s["held"], "distinct": s["parameters"],
                 "layers": [len(chunk) for chunk in s["layers"]]}]
               for s in probe["shards"]]
        for name, probe in dry_run_probes.items()
    }


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_rank_holds_what_the_plan_says(real, name):
    cfg = get_recipe(name)
    shards = {tuple(key): value for key, value in real[name]}
    counts, layers = stage_params(cfg), stage_layer_counts(cfg)
    assert set(shards) == {cfg.layout.coordinates(r).shard_key()
                           for r in range(cfg.layout.world_size)}
    for rank in range(cfg.layout.world_size):
        c = cfg.layout.coordinates(rank)
        built = shards[c.shard_key()]
        assert built["held"] == counts[c.pp].total, (name, rank)
        assert built["distinct"] == counts[c.pp].distinct(c.tp), (name, rank)
        assert built["layers"] == layers[c.pp], (name, rank)


# Dense models only: an MoE model's expert weights are counted per EP rank by the dry run, which
# the per-rank test above compares.
@pytest.mark.parametrize("name", [n for n in RECIPES if not get_recipe(n).model.num_moe_experts])
def test_whole_model_adds_up(real, name):
    cfg = get_recipe(name)
    shards = {tuple(key): value for key, value in real[name]}
    dense = sum(v["distinct"] for k, v in shards.items() if k[2] == 0)
    assert dense == model_parameters(cfg)

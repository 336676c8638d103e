"""Every registered recipe's `Layout` groups equal Megatron Core's own, rank for rank.

`Layout` does the rank arithmetic without torch so that validation, the planner and the dry run
can use it before any process group exists. If it drifted from Megatron Core (another rank
order, CP folded into the wrong grid, expert DP miscounted), every placement and group it
reports would be wrong while nothing crashed. The reference here is Megatron itself:
`layout_groups_probe.py` runs `parallel_state.initialize_model_parallel` for every rank of every
recipe on torch's fake backend, in subprocesses split over the cores (process groups are
process-wide state), which also run the dry run's probe (`recipe_probes`, tests/unit/conftest.py).
Recipes whose inputs to Megatron are equal (world size and raw parallel sizes:
`megatron_inputs`) are probed once, and each is checked against that answer.
"""

from __future__ import annotations

import pytest

from recipes.config.layout import GROUP_KINDS, Layout
from recipes.registry import RECIPES, get_recipe
from tests.unit.layout_groups_probe import probed_ranks

COORDINATES = ("tp", "pp", "dp", "cp", "ep")


@pytest.fixture(scope="module")
def megatron(layout_groups_probes) -> dict:
    """{recipe: {"ranks": [per-rank groups and coordinates], "created": {kind: groups}}}
    (tests/unit/conftest.py: probed once per session, beside the dry run)."""
    return layout_groups_probes


def group_mismatches(layout: Layout, records: list[dict]) -> list[str]:
    """One line per (rank, kind) where Layout's group differs from Megatron's."""
    return [
        f"rank {r['rank']} {kind}: ours {layout.group_of(kind, r['rank'])}, Megatron {theirs}"
        for r in records
        for kind, theirs in r["groups"].items()
        if layout.group_of(kind, r["rank"]) != theirs
    ]


def coordinate_mismatches(layout: Layout, records: list[dict]) -> list[str]:
    """One line per rank whose (tp, pp, dp, cp, ep) differ from Megatron's getters."""
    lines = []
    for r in records:
        coords = layout.coordinates(r["rank"])
        ours = {axis: getattr(coords, axis) for axis in COORDINATES}
        if ours != r["coordinates"]:
            lines.append(f"rank {r['rank']}: ours {ours}, Megatron {r['coordinates']}")
    return lines


@pytest.mark.parametrize("name", list(RECIPES))
def test_megatron_reported_every_rank_and_kind(megatron, name):
    """Guards the comparisons below against passing on an empty or partial probe."""
    cfg = get_recipe(name)
    records = megatron[name]["ranks"]
    assert [r["rank"] for r in records] == probed_ranks(cfg.cluster.world_size)
    for r in records:
        assert sorted(r["groups"]) == sorted(GROUP_KINDS)
    assert sorted(megatron[name]["created"]) == sorted(GROUP_KINDS)


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_ranks_groups_equal_megatrons(megatron, name):
    mismatches = group_mismatches(get_recipe(name).layout, megatron[name]["ranks"])
    assert not mismatches, f"{name}: {len(mismatches)} differ:\n" + "\n".join(mismatches[:20])


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_ranks_coordinates_equal_megatrons(megatron, name):
    mismatches = coordinate_mismatches(get_recipe(name).layout, megatron[name]["ranks"])
    assert not mismatches, f"{name}: {len(mismatches)} differ:\n" + "\n".join(mismatches[:20])


@pytest.mark.parametrize("name", list(RECIPES))
def test_group_lists_equal_the_groups_megatron_creates_in_order(megatron, name):
    """Whole lists: no missing or extra group, and groups in the order Megatron creates them."""
    layout = get_recipe(name).layout
    for kind, created in megatron[name]["created"].items():
        assert layout.groups(kind) == created, f"{name} {kind}"

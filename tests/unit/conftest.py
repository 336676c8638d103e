"""Fixtures shared by unit-test files.

`dry_run_probes`: every registered recipe dry-run once per session, in subprocesses (the dry
run activates the CPU runtime's process-wide patches and fake process groups): each distinct
shard's real model on the meta device, and the same model unsharded. Both the dry-run checks
(tests/unit/test_dry_run.py) and the planner's exact per-rank counts
(tests/unit/test_plan_params.py) read it, so the 50-odd recipes are built once, not twice.

`layout_groups_probes`: Megatron Core's own process groups of every recipe, rank by rank, which
tests/unit/test_layout_groups.py checks `Layout` against. A different computation from the dry
run's, but the same interpreters run both (`recipe_probes`, tests/unit/recipe_probe.py): each
part imports torch and Megatron Core once, not once per probe.

`tiny_llama_import`: one successful `scripts/convert.py import` of the tiny Llama per session,
whose output and printout the manifest, contents and digest tests each check (about 10 s an
import; tests/unit/hf_tiny_import.py).
"""

from __future__ import annotations

from itertools import zip_longest

import pytest

from recipes.registry import RECIPES, get_recipe
from tests.unit.probes import balanced_parts, part_count, probe_parts


def dry_run_cost(name: str) -> float:
    """About the CPU milliseconds a recipe's dry run takes (within 30% for the big ones): 5 per
    decoder layer built (each TP rank of the shard world builds every layer, plus the unsharded
    model), 1.5 per routed expert built, and 0.5 per rank x rank of the shard world (each fake
    rank's parallel-state set-up creates every group of that world)."""
    from recipes.plan.command import shard_world
    from recipes.plan.params import moe_layers_built

    cfg = get_recipe(name)
    m, layout = cfg.model, cfg.layout
    experts = m.num_moe_experts or 0
    moe_layers = moe_layers_built(m) if experts else 0
    world = shard_world(cfg).layout.world_size
    layers = (layout.tensor + 1) * m.num_layers
    built_experts = moe_layers * (layout.tensor * experts // layout.expert + experts)
    return 5 * layers + 1.5 * built_experts + 0.5 * world * world


def dry_run_family(name: str) -> str:
    """Recipes whose shards one dry-run process builds once (trainer/tools/dry_run.py
    `_distinct_shards`): the same shard signature in the shard world."""
    from recipes.plan.command import shard_world
    from trainer.tools.dry_run import shard_signature

    return shard_signature(shard_world(get_recipe(name)))


def layout_groups_cost(name: str) -> int:
    """The groups probe's work on a recipe, for balancing its parts: each rank probed sets up
    Megatron's groups of the whole world, so ranks probed x world size."""
    from tests.unit.layout_groups_probe import probed_ranks

    world = get_recipe(name).cluster.world_size
    return len(probed_ranks(world)) * world


def layout_groups_probed() -> dict[str, str]:
    """{recipe: the recipe probed for it}: the first of those whose inputs to Megatron are equal
    (world size and raw parallel sizes, `megatron_inputs`), which get equal groups."""
    from tests.unit.layout_groups_probe import megatron_inputs

    first: dict[tuple, str] = {}
    return {name: first.setdefault(tuple(sorted(megatron_inputs(get_recipe(name)).items())),
                                   name) for name in RECIPES}


PROBES = ("layout_groups", "dry_run")  # `<kind>_probes` fixtures that read `recipe_probes`


@pytest.fixture(scope="session")
def recipe_probes(request) -> dict:
    """{kind: {recipe: what the probe found}} of each probe a selected test reads (through its
    `<kind>_probes` fixture). Each probe's recipes are split over the cores on its own cost
    estimate, and part i of one runs in the same interpreter as part i of the other
    (tests/unit/probes.py, recipe_probe.py), so the parts stay balanced."""
    wanted = {kind for item in request.session.items for kind in PROBES
              if f"{kind}_probes" in item.fixturenames}
    probed = layout_groups_probed() if "layout_groups" in wanted else {}
    groups = balanced_parts(sorted(set(probed.values())), layout_groups_cost, part_count())
    dry = (balanced_parts(list(RECIPES), dry_run_cost, part_count(), dry_run_family)
           if "dry_run" in wanted else [])
    parts = probe_parts("recipe_probe.py", [
        [f"layout_groups:{name}" for name in g] + [f"dry_run:{name}" for name in d]
        for g, d in zip_longest(groups, dry, fillvalue=[])])
    found = {kind: {name: answer for part in parts for name, answer in part[kind].items()}
             for kind in PROBES}
    found["layout_groups"] = {name: found["layout_groups"][first]
                              for name, first in probed.items()}
    return found


@pytest.fixture(scope="session")
def dry_run_probes(recipe_probes) -> dict:
    """The dry run of every recipe, split over the machine's cores (tests/unit/probes.py)."""
    return recipe_probes["dry_run"]


@pytest.fixture(scope="session")
def layout_groups_probes(recipe_probes) -> dict:
    """{recipe: {"ranks": [per-rank groups and coordinates], "created": {kind: groups}}}:
    Megatron's answer for the recipe's inputs (tests/unit/layout_groups_probe.py)."""
    return recipe_probes["layout_groups"]


@pytest.fixture(scope="session")
def tiny_llama_import(tmp_path_factory):
    """One `scripts/convert.py import` of the tiny Llama for the session, read by the manifest,
    contents and digest tests alike (tests/unit/hf_tiny_import.py); don't write into it."""
    from tests.unit.hf_tiny_import import import_once

    return import_once(tmp_path_factory.mktemp("tiny_llama_import"))

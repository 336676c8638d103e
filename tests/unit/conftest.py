"""Fixtures shared by unit-test files.

`dry_run_probes`: every registered recipe dry-run once per session, in subprocesses (the dry
run activates the CPU runtime's process-wide patches and fake process groups): each distinct
shard's real model on the meta device, and the same model unsharded. Both the dry-run checks
(tests/unit/test_dry_run.py) and the planner's exact per-rank counts
(tests/unit/test_plan_params.py) read it, so the 50-odd recipes are built once, not twice.

`tiny_llama_import`: one successful `scripts/convert.py import` of the tiny Llama per session,
whose output and printout the manifest, contents and digest tests each check (about 10 s an
import; tests/unit/hf_tiny_import.py).
"""

from __future__ import annotations

import pytest

from recipes.registry import RECIPES, get_recipe
from tests.unit.probes import split_probe


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


@pytest.fixture(scope="session")
def dry_run_probes() -> dict:
    """The dry run of every recipe, split over the machine's cores (tests/unit/probes.py)."""
    found: dict = {}
    for part in split_probe("dry_run_probe.py", list(RECIPES), dry_run_cost, dry_run_family):
        found.update(part)
    return found


@pytest.fixture(scope="session")
def tiny_llama_import(tmp_path_factory):
    """One `scripts/convert.py import` of the tiny Llama for the session, read by the manifest,
    contents and digest tests alike (tests/unit/hf_tiny_import.py); don't write into it."""
    from tests.unit.hf_tiny_import import import_once

    return import_once(tmp_path_factory.mktemp("tiny_llama_import"))

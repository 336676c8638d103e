"""Fixtures shared by unit-test files.

`dry_run_probes`: every registered recipe dry-run once per session, in subprocesses (the dry
run activates the CPU runtime's process-wide patches and fake process groups): each distinct
shard's real model on the meta device, and the same model unsharded. Both the dry-run checks
(tests/unit/test_dry_run.py) and the planner's exact per-rank counts
(tests/unit/test_plan_params.py) read it, so the 50-odd recipes are built once, not twice.
"""

from __future__ import annotations

import pytest

from recipes.registry import RECIPES
from tests.unit.probes import split_probe


@pytest.fixture(scope="session")
def dry_run_probes() -> dict:
    """The dry run of every recipe, split over the machine's cores (tests/unit/probes.py)."""
    found: dict = {}
    for part in split_probe("dry_run_probe.py", list(RECIPES)):
        found.update(part)
    return found

"""Fixtures shared by unit-test files.

`dry_run_probes`: every registered recipe dry-run once per session, in a subprocess (the dry
run activates the CPU runtime's process-wide patches and fake process groups): each distinct
shard's real model on the meta device, and the same model unsharded. Both the dry-run checks
(tests/unit/test_dry_run.py) and the planner's exact per-rank counts
(tests/unit/test_plan_params.py) read it, so the 50-odd recipes are built once, not twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.registry import RECIPES

REPO = Path(__file__).resolve().parents[2]


def _probe(names: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "unit" / "dry_run_probe.py"), *names],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="session")
def dry_run_probes() -> dict:
    """The dry run of every recipe, split over the machine's cores (the suite runs one test at
    a time, so the others would idle); contiguous by name, so a family whose recipes hold the
    same shards (the 405B layouts) is built once, in one process."""
    names = sorted(RECIPES)
    parts = max(1, min(os.cpu_count() or 1, 4))
    size = -(-len(names) // parts)
    processes = [_probe(names[i:i + size]) for i in range(0, len(names), size)]
    found: dict = {}
    for process in processes:
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, err[-3000:]
        found.update(json.loads(out.splitlines()[-1]))
    return found

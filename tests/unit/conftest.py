"""Fixtures shared by unit-test files.

`dry_run_probes`: every registered recipe dry-run once per session, in a subprocess (the dry
run activates the CPU runtime's process-wide patches and fake process groups): each distinct
shard's real model on the meta device, and the same model unsharded. Both the dry-run checks
(tests/unit/test_dry_run.py) and the planner's exact per-rank counts
(tests/unit/test_plan_params.py) read it, so the 50-odd recipes are built once, not twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.registry import RECIPES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dry_run_probes() -> dict:
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "unit" / "dry_run_probe.py"), *RECIPES],
        capture_output=True, text=True, cwd=REPO, timeout=900,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])

"""Golden numerics: the tiny reference run's loss trace must match the checked-in one.

Catches an upgrade (torch, Megatron Core) or a trainer change that silently alters numerics.
Regenerate deliberately with `UPDATE_GOLDEN=1 .venv/bin/python -m pytest
tests/dist/test_golden_numerics.py` and explain the change in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny_dp1_synthetic.json"
STEPS = 8
# Same torch/Megatron on another x86 CPU may reorder float sums (measured ~1e-6 level).
TOLERANCE = 1e-4


def test_loss_trace_matches_golden(launch_ranks, tmp_path):
    result = launch_ranks(1, "tests.dist.layout_runs:train_steps", {
        "recipe": "tiny_dp1", "steps": STEPS, "run_dir": str(tmp_path),
    })[0]
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({"recipe": "tiny_dp1", "data": "synthetic", **result},
                                     indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert len(golden["losses"]) == STEPS
    assert result["losses"] == pytest.approx(golden["losses"], abs=TOLERANCE, rel=0)
    assert result["grad_norms"] == pytest.approx(golden["grad_norms"], rel=1e-3)

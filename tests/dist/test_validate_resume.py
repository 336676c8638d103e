"""`scripts/validate_resume.py` end to end on local ranks: a recipe with dropout on two DP
ranks passes every check (loss, lr, consumed tokens, data order, RNG streams) and exits 0.
The failing side of the table is tests/unit/test_resume_check.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = [pytest.mark.dist, pytest.mark.scripts_unit]

REPO = Path(__file__).resolve().parents[2]


def test_validate_resume_passes_for_a_recipe_with_dropout(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "validate_resume.py"), "recipe=tiny_dp2",
         "data.source=synthetic", "data.max_corpus_bytes=120000", "model.hidden_dropout=0.1",
         "train.eval_iters=0", "train.eval_interval=0", f"run_dir={tmp_path}", "steps=4",
         "save_at=2"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("validate_resume tiny_dp2"):].splitlines()
    checks = {line.split()[0] for line in table if line.startswith("  ") and " pass " in line}
    assert checks == {"loss", "learning", "consumed", "data", "RNG"}
    assert table[-1] == "all checks pass"
    assert not (tmp_path / "validate_resume").exists()  # removed after a pass


def test_validate_resume_passes_for_megatron_fsdp(tmp_path):
    """The ZeRO-3 recipe: its fsdp_dtensor checkpoint resumes exactly (every check passes)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "validate_resume.py"), "recipe=tiny_dp2_fsdp",
         "data.source=synthetic", "data.max_corpus_bytes=120000", "train.eval_iters=0",
         "train.eval_interval=0", f"run_dir={tmp_path}", "steps=4", "save_at=2"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "all checks pass"

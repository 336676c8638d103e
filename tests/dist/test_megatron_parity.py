"""`scripts/check_megatron_parity.py` end to end: 3 steps of tiny_dp1 with this trainer and with
Megatron-LM's `megatron.training.pretrain` (from the wheel, on the CPU runtime) from the same
initial weights on the same batches end bit-identical: every final weight, grad norm and
learning rate; the losses within one fp32 rounding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]


def test_tiny_dp1_trains_bit_identically_to_megatron_lm(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_megatron_parity.py"), "recipe=tiny_dp1",
         "data.max_corpus_bytes=120000", f"run_dir={tmp_path}", "steps=3"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = result.stdout[result.stdout.index("check_megatron_parity tiny_dp1"):].splitlines()
    steps = [line.split() for line in report if line[:6].strip().isdigit()]
    assert [int(row[0]) for row in steps] == [1, 2, 3]
    assert all(float(row[2]) < 1e-6 and row[4] == "0" and row[6] == "0" for row in steps)
    assert "final weights: max |difference| 0, 0 tensors differ" in result.stdout
    assert report[-1].startswith("bit-identical")
    assert "--calculate-per-token-loss" in result.stdout  # an alignment, printed

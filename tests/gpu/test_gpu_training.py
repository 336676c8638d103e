"""On a GPU node: the same trainer runs on CUDA (NCCL, TE layers when Transformer Engine is
installed) and the CPU runtime stays off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_run_trains_on_one_gpu(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), "recipe=tiny_dp1",
         f"run_dir={tmp_path}", "train.train_iters=40", "train.eval_interval=20",
         "scheduler.warmup_iters=5", "data.source=synthetic"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["backend"] == "GPU (nccl)"
    heldout = [r["loss"] for r in records if r["kind"] == "heldout"]
    assert heldout[-1] < heldout[0] - 0.5


def test_cpu_runtime_auto_stays_off_with_cuda():
    from plugins.cpu_runtime.config import CpuRuntimeConfig
    from plugins.cpu_runtime.runtime import activate_cpu_runtime

    assert activate_cpu_runtime(CpuRuntimeConfig(enabled="auto")) is False

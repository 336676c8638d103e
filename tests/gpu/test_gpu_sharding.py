"""On one GPU: a Megatron FSDP (ZeRO-3) run and an optimizer-offload run train, and their peak
device memory is the planner's peak within 10 %.

DP1 exercises the code path, not the sharding: Megatron FSDP's buffers, hooks and fsdp_dtensor
save on CUDA, the hybrid-device optimizer stepping the whole state on the CPU with its copies
to and from the device. The model is sized so model state dominates the peak (about 0.8
billion parameters, 256-token sequences), on Megatron's local layers (explicit attention), so
the comparison tests the planner's bytes per parameter for each, not its activation model.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "conf/cluster/h200_1x8.yaml"
STEPS = 4
TOLERANCE = 0.10
SIZED = ["recipe=tiny_dp1", "model.transformer_impl=local", "model.hidden_size=4096",
         "model.ffn_hidden_size=16384", "model.num_attention_heads=32", "model.seq_length=256",
         "precision.dtype=bf16", "optimizer.distributed=true", f"cluster.spec={CLUSTER}",
         "data.source=synthetic", f"train.train_iters={STEPS}", "train.eval_interval=0",
         "train.eval_iters=0", "scheduler.warmup_iters=1", "logging.log_interval=1"]
RUNS = {
    "fsdp": ["optimizer.fsdp=optim_grads_params"],
    "offload": ["optimizer.cpu_offload=true"],
}


def _planned_peak(overrides: list[str]) -> float:
    from recipes.plan.build import PlanOptions, make_plan
    from recipes.plan.cluster import load_cluster
    from recipes.resolve import resolve_config

    cfg = resolve_config(overrides)
    plan = make_plan(cfg, load_cluster(CLUSTER), PlanOptions(attention="explicit"))
    return plan.worst.peak


@pytest.mark.parametrize("kind", list(RUNS))
def test_sharded_step_on_one_gpu_matches_the_plan(tmp_path, kind, capsys):
    overrides = [*SIZED, *RUNS[kind]]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "pretrain.py"), *overrides,
                           f"run_dir={tmp_path}"], capture_output=True, text=True, cwd=REPO,
                          timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == STEPS and all(math.isfinite(r["loss"]) for r in train)
    measured = max(r["memory_gib"] for r in train if r["memory_gib"] is not None) * 2**30
    planned = _planned_peak(overrides)
    # Shown when the test passes too (`pytest -q` keeps a passing test's output otherwise): the
    # figure is what the run is for.
    with capsys.disabled():
        print(f"\n{kind}: peak {measured / 1e9:.2f} GB measured, {planned / 1e9:.2f} GB planned "
              f"(x{measured / planned:.2f}, goal within {TOLERANCE:.0%})", flush=True)
    assert abs(measured - planned) <= TOLERANCE * planned
    if kind == "fsdp":
        from trainer.checkpoint.format import checkpoint_backend, newest_checkpoint

        assert checkpoint_backend(newest_checkpoint(tmp_path / "checkpoints")) == "fsdp_dtensor"

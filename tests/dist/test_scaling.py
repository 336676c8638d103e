"""`scripts/scaling.py` end to end on CPU ranks 1 and 2: table, JSON and PNG plots, and the
trainer's step figures behind them (warm-up and profiled steps left out of throughput)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = [pytest.mark.dist, pytest.mark.scripts_unit]

REPO = Path(__file__).resolve().parents[2]
STEPS = 5  # 1 warm-up, 2 profiled, 2 measured


@pytest.fixture(scope="module")
def weak_sweep(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("scaling") / "report"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "scaling.py"), "recipe=tiny_dp1",
         "scaling.world_sizes=[1,2]", "scaling.mode=weak", f"scaling.steps={STEPS}",
         f"scaling.out={out}", "model.seq_length=64"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result, out


def test_report_has_table_json_and_plots(weak_sweep):
    result, out = weak_sweep
    assert "tiny_dp1: weak scaling over [1, 2] ranks (CPU figures)" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "TP1 x PP1 x DP" in line]
    assert len(rows) == 2 and (out / "report.txt").read_text().strip() in result.stdout
    for name in ("throughput.png", "efficiency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "report.json").read_text())
    one, two = report["points"]
    assert (one["gpus"], two["gpus"]) == (1, 2)
    assert one["efficiency"] == 1.0 and two["efficiency"] is not None
    assert two["efficiency"] == pytest.approx(
        two["effective_tokens_per_s"] / (2 * one["effective_tokens_per_s"]))
    assert (one["conditions"]["global_batch"], two["conditions"]["global_batch"]) == (8, 16)
    assert two["conditions"]["tokens_per_step"] == 16 * 64
    assert two["not_comparable"] == [] and one["mfu"] is None
    for point in (one, two):
        assert point["measured_steps"] == STEPS - 3
        assert point["diagnosis"]["bottleneck"] in point["diagnosis"]["evidence"]
        assert point["hours_for_budget"] * point["gpus"] == pytest.approx(
            point["gpu_hours_for_budget"])


def test_dp2_counts_both_replicas_tokens_once(weak_sweep):
    _, out = weak_sweep
    report = json.loads((out / "report.json").read_text())
    one, two = (p["conditions"]["loss_tokens_per_step"] for p in report["points"])
    # Twice the samples, each loss token counted once: close to twice the tokens (EOD inputs
    # carry no loss, so neither equals the positions of the batch).
    assert 0.9 * 2 * one <= two <= 16 * 64 and one <= 8 * 64


def test_run_records_mark_warm_up_and_profiled_steps(weak_sweep):
    _, out = weak_sweep
    lines = (out / "G2" / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(line) for line in lines if '"kind": "train"' in line]
    assert [r["measured"] for r in train] == [False, False, False, True, True]
    assert [r["exposed_comm_s"] is not None for r in train] == [False, True, True, False, False]
    assert [len(r["stage_compute_s"] or []) for r in train] == [0, 1, 1, 0, 0]  # one stage
    assert [r["memory_gib"] is not None for r in train] == [False] * 4 + [True]  # logged step
    assert train[-1]["memory_gib"] > 0.05  # a torch process's resident set on CPU ranks
    for record in train:
        assert min(record["data_wait_s"], record["forward_backward_s"], record["optimizer_s"]) > 0
        assert record["model_tflops_per_gpu"] > 0 and record["mfu"] is None
    summary = json.loads(lines[-1])
    measured = train[3:]
    expected = sum(r["loss_tokens"] for r in measured) / sum(r["step_time_s"] for r in measured)
    assert summary["effective_tokens_per_s"] == pytest.approx(expected)


def test_full_rows_keep_the_configured_flops_and_the_summary_sums_measured_steps(weak_sweep):
    """Concatenated rows: every step's FLOPs are the recipe's global batch of full rows
    (`step_flops`, n and n² per row); the summary's and the report's TFLOP/s are those of the
    measured steps over their seconds."""
    from recipes.config.io import load_config
    from recipes.plan.flops import step_flops

    _, out = weak_sweep
    cfg = load_config(out / "G2" / "config.yaml")
    lines = (out / "G2" / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(line) for line in lines if '"kind": "train"' in line]
    for record in train:
        assert record["model_flops"] == pytest.approx(step_flops(cfg), rel=1e-12)
        assert record["model_tflops_per_gpu"] == pytest.approx(
            record["model_flops"] / record["step_time_s"] / 2 / 1e12, rel=1e-12)
    measured = [r for r in train if r["measured"]]
    expected = (sum(r["model_flops"] for r in measured)
                / sum(r["step_time_s"] for r in measured) / 2 / 1e12)
    assert json.loads(lines[-1])["model_tflops_per_gpu"] == pytest.approx(expected, rel=1e-12)
    report = json.loads((out / "report.json").read_text())
    assert report["points"][1]["model_tflops_per_gpu"] == pytest.approx(expected, rel=1e-12)


def test_the_report_is_written_again_from_the_sweep_directory(weak_sweep):
    """What a cluster sweep does once its jobs have finished: read the runs, write the report."""
    result, out = weak_sweep
    before = (out / "report.txt").read_text()
    (out / "report.txt").unlink()
    again = subprocess.run([sys.executable, str(REPO / "scripts" / "scaling.py"),
                            f"scaling.report={out}"],
                           capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "report.txt").read_text() == before
    report = json.loads((out / "report.json").read_text())
    assert all(point["memory_gib"] > 0 for point in report["points"])

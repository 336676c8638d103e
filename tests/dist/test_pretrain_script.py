"""`scripts/pretrain.py` end to end: self-launch, training, held-out loss, checkpoint, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = [pytest.mark.dist, pytest.mark.scripts_unit]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "pretrain.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
        timeout=HANG_S,
    )


def read_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def short_default_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The default recipe (TP2 x PP2 on 4 local ranks), shortened to 40 steps."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    result = run_script(
        f"run_dir={run_dir}", "train.train_iters=40", "train.eval_interval=20",
        "scheduler.warmup_iters=5", "logging.log_interval=10",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_dir


def test_default_run_lowers_heldout_loss(short_default_run):
    _, run_dir = short_default_run
    heldout = [r["loss"] for r in read_records(run_dir) if r["kind"] == "heldout"]
    assert len(heldout) == 3  # before training, at step 20, at step 40
    assert heldout[-1] < heldout[0] - 1.0


def test_default_run_logs_every_interval_and_summarises(short_default_run):
    result, run_dir = short_default_run
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["10/40", "20/40", "30/40", "40/40"]
    for field in ("loss", "lr", "grad norm", "tok/s", "s/step"):
        assert field in lines[0]
    summary = read_records(run_dir)[-1]
    assert summary["kind"] == "summary"
    assert summary["layout"] == "TP2 x PP2 x DP1 (4 ranks)"
    assert summary["tokens_seen"] == 40 * 8 * 128
    assert "run summary" in result.stdout


def test_default_run_writes_a_loadable_checkpoint_and_config(short_default_run, tmp_path):
    _, run_dir = short_default_run
    checkpoint = run_dir / "checkpoints" / "step_0000040"
    assert (checkpoint / "metadata.json").exists()
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_0000040"
    # The saved config reproduces the run; its weights load into another layout (TP2 on 2 ranks).
    result = run_script(
        f"config={run_dir / 'config.yaml'}", f"run_dir={tmp_path / 'again'}",
        "parallel.pipeline=1", "cluster.gpus_per_node=2",
        f"checkpoint.load={run_dir / 'checkpoints'}", "checkpoint.load_model_only=true",
        "train.train_iters=1",
        "scheduler.warmup_iters=0", "checkpoint.save=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trained = [r["loss"] for r in read_records(run_dir) if r["kind"] == "heldout"][-1]
    reloaded = [r["loss"] for r in read_records(tmp_path / "again") if r["kind"] == "heldout"][0]
    assert reloaded == pytest.approx(trained, abs=0.02)


def test_nonfinite_loss_stops_with_one_line(tmp_path):
    result = run_script(
        "recipe=tiny_dp2", f"run_dir={tmp_path}", "optimizer.lr=1e30", "optimizer.min_lr=0",
        "optimizer.clip_grad=0", "scheduler.warmup_iters=0", "train.train_iters=20",
        "train.eval_iters=0", "train.eval_interval=0", "data.source=synthetic",
    )
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: non-finite values at step ")
    assert "Traceback" not in result.stderr


def test_wrong_machine_is_refused_in_one_line_before_launch():
    result = run_script("recipe=8b_tp8_pp4_dp2", "data.source=synthetic")
    assert result.returncode == 2
    assert "launching" not in result.stdout  # no rank was started
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "needs 64 GPUs" in lines[0] and "dry_run=true" in lines[0]


def test_held_out_split_below_one_batch_matters_only_to_an_evaluation(tmp_path):
    """3 held-out samples of a global batch of 8: refused where the run evaluates, trained where
    `train.eval_iters=0` never reads them."""
    common = ("recipe=tiny_dp1", "data.heldout_fraction=0.0001", "train.train_iters=1",
              "scheduler.warmup_iters=0", "checkpoint.save=false", "train.eval_interval=0")
    refused = run_script(*common, f"run_dir={tmp_path / 'evaluated'}", "train.eval_iters=1")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "error: the held-out split has 3 samples" in refused.stderr
    trained = run_script(*common, f"run_dir={tmp_path / 'not_evaluated'}", "train.eval_iters=0")
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = read_records(tmp_path / "not_evaluated")
    assert [r["kind"] for r in records if r["kind"] == "heldout"] == []
    assert records[-1]["kind"] == "summary"

"""Logging plugins on a real run: TensorBoard event files and an offline W&B run hold the same
scalars as metrics.jsonl, written once (rank 0 of two); the loss curve PNG; the profiler trace.

The event files are read back with TensorBoard's own EventAccumulator, the W&B run with
`tests/dist/wandb_records.py` (its `.wandb` file decoded record by record).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.dist.wandb_records import find_run_files, wait_for_history

pytestmark = pytest.mark.dist

STEPS = 4


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for line in lines if (record := json.loads(line))["kind"] == kind]


def _expected(run_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every finite number metrics.jsonl records (extra flattened)."""
    expected: dict[str, dict[int, float]] = {}
    for kind, prefix in (("train", "train"), ("heldout", "heldout")):
        for record in _records(run_dir, kind):
            flat = {**record, **record.get("extra", {})}
            for name, value in flat.items():
                if name in ("kind", "step", "extra") or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    expected.setdefault(f"{prefix}/{name}", {})[record["step"]] = float(value)
    return expected


@pytest.fixture(scope="module")
def logged_run(launch_ranks, tmp_path_factory) -> Path:
    """tiny_dp2 (two ranks) for 4 steps with held-out loss at 0, 2, 4, both loggers, profiler."""
    run_dir = tmp_path_factory.mktemp("logged") / "run"
    overrides = [f"train.train_iters={STEPS}", "train.eval_interval=2",
                 "plugins.logging.tensorboard=true", "plugins.logging.wandb=offline",
                 "plugins.profiler.enabled=true", "plugins.profiler.start_step=2",
                 "plugins.profiler.steps=2"]  # 4 steps: the trainer profiles none itself
    payload = {"recipe": "tiny_dp2", "overrides": overrides, "run_dir": str(run_dir)}
    assert launch_ranks(2, "tests.dist.logging_runs:pretrain", payload) == [{"exit": 0}] * 2
    return run_dir


def test_tensorboard_events_equal_metrics_jsonl(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_files = list((logged_run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1  # rank 0 only
    events = EventAccumulator(str(event_files[0]), size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)}
              for tag in events.Tags()["scalars"]}
    expected = _expected(logged_run)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "train/model_tflops_per_gpu", "train/memory_gib", "heldout/loss"):
        assert tag in expected
    assert sorted(expected["train/memory_gib"]) == [STEPS]  # logged steps only (and the last)
    assert set(expected) <= set(logged)
    for tag, values in expected.items():
        assert sorted(logged[tag]) == sorted(values), tag  # each step once, no duplicates
        for step, value in values.items():
            assert logged[tag][step] == pytest.approx(value, rel=1e-6), (tag, step)
    assert sorted(expected["heldout/loss"]) == [0, 2, 4]


def test_offline_wandb_run_equals_metrics_jsonl(logged_run):
    run_files = find_run_files(logged_run)
    assert len(run_files) == 1  # one offline run, from rank 0
    rows = wait_for_history(logged_run, rows=STEPS + 1)  # held-out at 0, then 4 steps
    logged: dict[str, dict[int, float]] = {}
    for row in rows:
        for tag, value in row.items():
            if not tag.startswith("_"):
                assert row["_step"] not in logged.get(tag, {}), (tag, row["_step"])
                logged.setdefault(tag, {})[row["_step"]] = value
    expected = _expected(logged_run)
    assert set(expected) <= set(logged)
    for tag, values in expected.items():
        assert logged[tag] == pytest.approx(values, rel=1e-12), tag


def test_loss_curve_png_is_written_at_the_end(logged_run):
    png = logged_run / "loss_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib import image

    height, width, _ = image.imread(png).shape
    assert (width, height) == (800, 600)


def test_profiler_writes_a_chrome_trace_with_the_step_labels(logged_run):
    traces = list((logged_run / "profile").glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0"]  # rank 0 only by default
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = [event.get("name") for event in events]
    for label in ("data wait", "forward-backward", "optimizer"):
        assert names.count(label) == 2, label  # once per step of the 2-step window

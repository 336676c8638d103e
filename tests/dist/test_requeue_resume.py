"""A requeued job continues its run: two starts of `scripts/pretrain.py` with the same
arguments, `run_dir=<dir> checkpoint.resume=true` (what `scripts/launch.py` puts into a Slurm
job, which `scontrol requeue` reruns unchanged).

Each start is the real entry pipeline (PRETRAIN's rank path) on one rank of an
outside launch, as torchrun starts it on a node, forked by the session's rank server so torch is
imported once: the first start finds no checkpoint, says so and trains steps 1-2; the second
resolves the resume to `checkpoint.load=<run_dir>/checkpoints`, passes the run.json pre-flight
and trains step 3 only.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

START = "tests.dist.test_requeue_resume:start"
SMALL = ["recipe=tiny_dp1", "data.source=synthetic", "data.max_corpus_bytes=120000",
         "train.eval_iters=0", "train.eval_interval=0", "logging.progress_bar=false",
         "plugins.logging.loss_curve=false", "scheduler.warmup_iters=1"]


def start(payload: dict) -> dict:
    """One start of pretrain.py on this rank: its exit code and what it printed."""
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import parse_arguments

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = PRETRAIN.run(parse_arguments(PRETRAIN, payload["argv"]))
    return {"code": code, "stdout": printed.getvalue()}


def _train_steps(run_dir: Path) -> list[int]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [record["step"] for record in records if record["kind"] == "train"]


def test_second_start_with_resume_continues_from_the_saved_step(launch_ranks, tmp_path):
    run_dir = tmp_path / "run"
    argv = [*SMALL, f"run_dir={run_dir}", "checkpoint.resume=true"]

    [first] = launch_ranks(1, START, {"argv": [*argv, "train.train_iters=2"]})
    assert first["code"] == 0
    assert f"resume: run_dir={run_dir} holds no checkpoint yet; starting from step 0" in \
        first["stdout"]
    assert _train_steps(run_dir) == [1, 2]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_0000002"

    [second] = launch_ranks(1, START, {"argv": [*argv, "train.train_iters=3"]})
    assert second["code"] == 0
    assert f"resume: resuming from {run_dir / 'checkpoints' / 'step_0000002'} (step 2" in \
        second["stdout"]
    assert "starting from step 0" not in second["stdout"]
    assert _train_steps(run_dir) == [1, 2, 3]  # metrics.jsonl is appended: the second adds 3
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_0000003"

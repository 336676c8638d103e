"""A save onto a file system that fills up mid-write: one line, the previous checkpoint and
`latest` whole, nothing half-written named like a checkpoint (trainer/checkpoint/disk_errors.py).
Megatron's writer hands the failure on without its errno, so the one line needs the disk asked
(`megatron_fixes`, `disk_asked_after_a_failed_write`): without that the run ends in a traceback.

The run directory is on a small tmpfs (root mounts it; skipped where that is not allowed) that
holds the step-2 checkpoint of the tiny recipe but not the step-4 one beside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.dist.test_requeue_resume import SMALL
from tests.unit.test_prepare_full_disk import small_tmpfs

pytestmark = pytest.mark.dist

START = "tests.dist.test_full_disk:start"
TMPFS_SIZE = "5m"  # one tiny_dp1 checkpoint is 2.9 MB


def start(payload: dict) -> dict:
    """pretrain.py on this rank through the entry contract, which prints a refusal to stderr;
    returns the exit code and everything this rank wrote to stderr (a file, rank_entry.py).
    `skip` names Megatron fixes to leave out."""
    from trainer.checkpoint.megatron_fixes import skipping
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import main

    with skipping(payload.get("skip", ())):
        code = main(PRETRAIN, payload["argv"])
    sys.stderr.flush()
    return {"code": code, "stderr": Path(os.readlink("/proc/self/fd/2")).read_text()}


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small_disk", TMPFS_SIZE) as mount:
        yield mount


def test_a_save_onto_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(
        launch_ranks, small_disk):
    from trainer.checkpoint.manifest import damaged_file, read_manifest

    run_dir = small_disk / "run"
    argv = [*SMALL, f"run_dir={run_dir}", "train.train_iters=4", "checkpoint.save_interval=2"]
    [result] = launch_ranks(1, START, {"argv": argv})
    root = run_dir / "checkpoints"
    errors = [line for line in result["stderr"].splitlines() if "error" in line.lower()]
    assert errors == [  # Megatron's writer logs nothing of its own (megatron_fixes.py)
        f"error: the checkpoint of step 4 could not be written to {root} (No space left on "
        "device); the unfinished save was removed and step_0000002 and latest are untouched "
        "(resume from them with checkpoint.resume=true run_dir=<this run>); free space there "
        "or point output_dir / run_dir at a larger file system"], result["stderr"][-3000:]
    assert result["code"] == 2
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000002"]
    assert (root / "latest").read_text() == "step_0000002"
    step = root / "step_0000002"
    assert damaged_file(step, read_manifest(step), True) is None  # every file as recorded


def test_without_asking_the_disk_a_full_disk_ends_in_a_traceback(launch_ranks, small_disk):
    run_dir = small_disk / "run"
    argv = [*SMALL, f"run_dir={run_dir}", "train.train_iters=4", "checkpoint.save_interval=2"]
    with pytest.raises(RuntimeError) as failed:  # the launch's RankLaunchError
        launch_ranks(1, START, {"argv": argv, "skip": ["disk_asked_after_a_failed_write"]})
    assert "Traceback" in str(failed.value)
    assert "could not be written" not in str(failed.value)

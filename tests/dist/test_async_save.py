"""Asynchronous saves (`checkpoint.async_save=true`, trainer/checkpoint/async_save.py): training
is the same with them as without, a step is published (`latest`) only after every rank's writer
has finished, a rank killed while the writers are at work leaves the previous checkpoint to
resume from, and a resume from an asynchronously written checkpoint continues exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dist.test_requeue_resume import SMALL
from trainer.checkpoint.format import newest_checkpoint, unfinished_saves
from trainer.checkpoint.manifest import damaged_file, read_manifest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.resume_runs"
RECIPE, RANKS, STEPS = "tiny_dp2_distopt", 2, 4
ASYNC = ["checkpoint.async_save=true"]
TERMINATED = "tests.dist.test_async_save:terminated_while_writing"


def terminated_while_writing(payload: dict) -> dict:
    """pretrain.py on this rank, SIGTERMed (as torchrun stops its ranks on scancel or a
    requeue) right after the writer of its first save started."""
    import os
    import signal

    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import main

    schedule = AsyncCallsQueue.schedule_async_request

    def then_terminated(queue, request):
        index = schedule(queue, request)
        os.kill(os.getpid(), signal.SIGTERM)
        return index

    AsyncCallsQueue.schedule_async_request = then_terminated
    return {"code": main(PRETRAIN, payload["argv"])}  # not reached: the signal ends the rank


def saved_both_ways(payload: dict) -> dict:
    """One step, then that state saved synchronously and asynchronously: each shard file's
    size and CRC-32. The asynchronous writer copies the parameters' views itself
    (`views_uncopied`)."""
    import zlib

    from tests.dist.layout_runs import _finish, _session
    from tests.dist.resume_runs import _step
    from trainer.checkpoint.async_save import finish_saves
    from trainer.checkpoint.save import save_checkpoint

    session = _session(payload)
    _step(session)
    files = {}
    for mode in ("sync", "async"):
        session.cfg.checkpoint.async_save = mode == "async"
        path = save_checkpoint(session, Path(payload["run_dir"]) / mode)
        finish_saves(session, blocking=True)
        files[mode] = {p.name: (p.stat().st_size, zlib.crc32(p.read_bytes()))
                       for p in sorted(path.glob("*.distcp"))}
    _finish()
    return files


@pytest.fixture(scope="module")
def async_run(launch_ranks, tmp_path_factory) -> tuple[Path, dict]:
    """One launch: 4 steps without saves, then 4 steps saving asynchronously after 1 and 2."""
    root = tmp_path_factory.mktemp("async")
    result = launch_ranks(RANKS, f"{ENTRY}:plain_then_async", {
        "recipe": RECIPE, "steps": STEPS, "run_dir": str(root), "save_at": [1, 2],
        "checkpoint_dir": str(root / "checkpoints"), "overrides": ASYNC,
    })[0]
    return root / "checkpoints", result


def test_async_saves_leave_training_alone_and_publish_once_written(async_run):
    root, result = async_run
    assert result["async"] == result["plain"]  # loss, lr, tokens, data: bit for bit
    # Each save returned with its step not yet published and `latest` on the one before.
    assert result["started"] == [{"step": 1, "published": False, "latest": None},
                                 {"step": 2, "published": False, "latest": "step_0000001"}]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000001", "step_0000002"]
    assert (root / "latest").read_text() == "step_0000002"
    step = root / "step_0000002"
    assert damaged_file(step, read_manifest(step), True) is None  # every file as recorded


def test_a_rank_killed_during_an_async_write_resumes_from_the_previous_checkpoint(
        launch_ranks, async_run, tmp_path):
    saved, result = async_run
    root = tmp_path / "checkpoints"
    shutil.copytree(saved, root)
    common = {"recipe": RECIPE, "run_dir": str(tmp_path), "checkpoint_dir": str(root),
              "overrides": [*ASYNC, f"checkpoint.load={root}"]}
    with pytest.raises(RuntimeError, match=r"exit codes \[.*-9"):
        launch_ranks(RANKS, f"{ENTRY}:die_during_async_write", {**common, "kill_rank": 1})
    assert (root / "latest").read_text() == "step_0000002"
    assert newest_checkpoint(root).name == "step_0000002"
    assert [p.name.split(".")[0] for p in unfinished_saves(root)] == ["step_0000003"]
    after = launch_ranks(RANKS, f"{ENTRY}:resumed", {**common, "steps": STEPS})[0]
    assert (after["start"], after["resumed_from"]) == (2, "step_0000002")
    assert after["records"] == result["async"][2:]


def test_sigterm_during_an_async_write_publishes_it_before_the_run_stops(launch_ranks, tmp_path):
    run_dir = tmp_path / "run"
    argv = [*SMALL, *ASYNC, f"run_dir={run_dir}", "train.train_iters=6",
            "checkpoint.save_interval=2"]
    with pytest.raises(RuntimeError, match=r"exit codes \[-15\]"):  # ended by the signal
        launch_ranks(1, TERMINATED, {"argv": argv})
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000002"]
    assert (root / "latest").read_text() == "step_0000002"
    step = root / "step_0000002"
    assert damaged_file(step, read_manifest(step), True) is None


def test_an_async_save_writes_the_bytes_of_a_synchronous_one(launch_ranks, tmp_path):
    # The views of the DDP buffer reach the writer uncopied; written as they are, each file
    # would hold whole buffers.
    for rank in launch_ranks(RANKS, "tests.dist.test_async_save:saved_both_ways",
                             {"recipe": RECIPE, "run_dir": str(tmp_path), "overrides": []}):
        assert rank["sync"] and rank["async"] == rank["sync"]

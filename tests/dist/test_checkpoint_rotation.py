"""Atomic publication and rotation on real saves (one gloo rank, `tiny_dp1`).

A run saving every step with `checkpoint.keep_last=2`, resumed from step 1, must end with the
two newest steps plus the one it resumed from, `latest` naming the newest and no `.tmp-` save
left behind. A crash's leftovers (a `.tmp-` save and a `latest` naming a directory that is gone)
must not stop a resume: it continues from the newest complete step. (That the next save then
removes the stale `.tmp-` directory is shown in the unit test, keeping this one under 20 s.)
The pure parts are covered without a process group in tests/unit/test_checkpoint_publication.py.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.layout_runs:train_saving_each_step"


def test_rotation_keeps_resumed_step_and_crash_leftovers_resume_from_newest(
    launch_ranks, tmp_path
) -> None:
    root = tmp_path / "checkpoints"
    common = {"recipe": "tiny_dp1", "run_dir": str(tmp_path), "checkpoint_dir": str(root)}
    first = launch_ranks(1, ENTRY, {**common, "steps": 1})[0]
    assert first["entries"] == ["latest", "step_0000001"]

    keep = ["checkpoint.keep_last=2", f"checkpoint.load={root}"]
    resumed = launch_ranks(1, ENTRY, {**common, "steps": 4, "overrides": keep})[0]
    assert (resumed["start"], resumed["resumed_from"]) == (1, "step_0000001")
    assert resumed["entries"] == ["latest", "step_0000001", "step_0000003", "step_0000004"]
    assert resumed["latest"] == "step_0000004"

    # A crash: a save that never got renamed, and a marker naming a directory that is gone.
    (root / "step_0000005.tmp-5-dead").mkdir()
    (root / "step_0000005.tmp-5-dead" / "metadata.json").write_text("{}")
    (root / "latest").write_text("step_0000009")
    after_crash = launch_ranks(1, ENTRY, {**common, "steps": 4, "overrides": keep})[0]
    assert (after_crash["start"], after_crash["resumed_from"]) == (4, "step_0000004")

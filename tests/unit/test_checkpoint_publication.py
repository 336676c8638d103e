"""Atomic checkpoint publication, without a process group: which step a root resumes from,
which steps rotation deletes, and what publishing leaves on disk.

A crash leaves either a `step_NNNNNNN.tmp-<token>` directory or a `latest` naming a directory
that is gone; a resume must then pick the newest complete step, and `checkpoint.keep_last`
must never delete the step a run resumed from. The run-level version (real saves, one rank) is
tests/dist/test_checkpoint_rotation.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.registry import get_recipe
from trainer.checkpoint.format import newest_checkpoint
from trainer.checkpoint.load import resolve_checkpoint_dir
from trainer.checkpoint.preflight import check_checkpoint_load_path
from trainer.checkpoint.publish import _rotate, checkpoints_to_delete, put_in_place


def _complete(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return path


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_latest_naming_a_complete_step_wins(tmp_path) -> None:
    _complete(tmp_path / "step_0000002")
    _complete(tmp_path / "step_0000003")
    (tmp_path / "latest").write_text("step_0000002\n")
    assert newest_checkpoint(tmp_path) == tmp_path / "step_0000002"


@pytest.mark.parametrize("latest", [None, "step_0000009", "step_0000004", ""])
def test_without_a_usable_latest_the_newest_complete_step_is_chosen(tmp_path, latest) -> None:
    _complete(tmp_path / "step_0000009.tmp-9-ab12")  # a crash before the rename: ignored
    (tmp_path / "step_0000004").mkdir()  # no metadata.json: not complete
    _complete(tmp_path / "step_0000003")
    _complete(tmp_path / "step_0000010")  # numeric order, not text order of unpadded names
    _complete(tmp_path / "step_0000002")
    if latest is not None:
        (tmp_path / "latest").write_text(latest)
    assert newest_checkpoint(tmp_path) == tmp_path / "step_0000010"
    assert resolve_checkpoint_dir(tmp_path) == tmp_path / "step_0000010"


def test_a_step_directory_resolves_to_itself(tmp_path) -> None:
    step = _complete(tmp_path / "step_0000005")
    assert resolve_checkpoint_dir(step) == step


def test_a_root_with_only_unfinished_saves_is_refused_before_any_rank_starts(tmp_path) -> None:
    _complete(tmp_path / "step_0000001.tmp-1-ab12")
    (tmp_path / "latest").write_text("step_0000001")
    cfg = get_recipe("tiny_dp1")
    cfg.checkpoint.load = str(tmp_path)
    message = check_checkpoint_load_path(cfg)
    assert message == (
        f"checkpoint.load={tmp_path}: latest names step_0000001, but {tmp_path}/step_0000001 "
        "does not exist and no other step is complete; point checkpoint.load at another "
        "checkpoint or set checkpoint.load=null"
    )
    _complete(tmp_path / "step_0000000")
    assert check_checkpoint_load_path(cfg) is None  # falls back to the complete step 0
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint_dir(tmp_path / "step_0000001.tmp-1-ab12" / "nothing")


@pytest.mark.parametrize(
    ("existing", "keep_last", "resumed_from", "deleted"),
    [
        ([1, 2, 3, 4], None, None, []),
        ([1, 2, 3, 4], 2, None, [1, 2]),
        ([4, 1, 3, 2], 2, 1, [2]),  # the resumed-from step survives rotation
        ([1, 2, 3, 4], 2, 4, [1, 2]),
        ([1, 2], 5, None, []),
        ([1, 2, 3], 1, 7, [1, 2]),  # resumed from another root's step: nothing to protect
    ],
)
def test_rotation_choice(existing, keep_last, resumed_from, deleted) -> None:
    assert checkpoints_to_delete(existing, keep_last, resumed_from) == deleted


def test_publish_renames_then_points_latest_and_rotation_cleans_up(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    resumed = _complete(root / "step_0000001")
    _complete(root / "step_0000002")
    _complete(root / "step_0000003")
    (root / "step_0000002.tmp-2-dead").mkdir()  # a crashed earlier save: stale
    (root / "step_0000009.tmp-9-beef").mkdir()  # newer than anything published: not touched
    tmp = _complete(root / "step_0000004.tmp-4-cafe")
    put_in_place(tmp, root / "step_0000004", keep_last=2, resumed_from=resumed)
    assert (root / "latest").read_text() == "step_0000004"
    assert _steps(root) == [
        "latest", "step_0000001", "step_0000003", "step_0000004", "step_0000009.tmp-9-beef"
    ]


def test_rotation_leaves_a_save_still_being_written_alone(tmp_path) -> None:
    """An asynchronous save of an older step (a run resumed from step 1 of a root that holds
    step 4) is not a crash leftover while its writer is at work."""
    root = tmp_path / "checkpoints"
    _complete(root / "step_0000004")
    writing = root / "step_0000002.tmp-2-cafe"
    writing.mkdir()
    (root / "step_0000003.tmp-3-dead").mkdir()
    _rotate(root, keep_last=1, resumed_from=None, writing=(writing,))
    assert _steps(root) == ["step_0000002.tmp-2-cafe", "step_0000004"]


def test_publishing_a_step_again_replaces_it(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    (_complete(root / "step_0000002") / "old").write_text("old")
    tmp = _complete(root / "step_0000002.tmp-2-cafe")
    put_in_place(tmp, root / "step_0000002", keep_last=None, resumed_from=None)
    assert _steps(root) == ["latest", "step_0000002"]
    assert not (root / "step_0000002" / "old").exists()

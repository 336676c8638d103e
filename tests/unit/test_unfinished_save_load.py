"""`checkpoint.load` naming a `.tmp-` directory (a save in progress, or one a crash left) is
refused before any rank starts, with its root's newest complete step: it may hold every file of
a checkpoint, marker included, and would otherwise load."""

from __future__ import annotations

import shutil

from tests.unit.checkpoint_damage_fixtures import load_cfg, project_root
from trainer.checkpoint.preflight import check_checkpoint_load_path, unfinished_save_problem


def test_a_tmp_directory_with_every_file_is_refused_naming_the_newest_step(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints")
    tmp = root / "step_0000006.tmp-6-abcd1234"
    shutil.copytree(root / "step_0000006", tmp)
    (tmp / "run.json").unlink()
    expected = (f"checkpoint.load={tmp} is an unfinished save (step_0000006.tmp-6-abcd1234: a "
                "save still in progress or one a crash left, '.tmp-' in its name), not a "
                f"checkpoint; set checkpoint.load={root} (its newest complete step is "
                "step_0000006)")
    assert unfinished_save_problem(str(tmp), tmp) == expected
    assert check_checkpoint_load_path(load_cfg(tmp)) == expected


def test_a_file_inside_a_tmp_directory_is_refused_the_same_way(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints", steps=(2,))
    tmp = root / "step_0000004.tmp-4-ab12"
    shutil.copytree(root / "step_0000002", tmp)
    message = check_checkpoint_load_path(load_cfg(tmp / "__0_0.distcp"))
    assert "is an unfinished save (step_0000004.tmp-4-ab12" in message
    assert message.endswith(f"set checkpoint.load={root} (its newest complete step is "
                            "step_0000002)")


def test_a_root_with_no_complete_step_says_so(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints", steps=(2,))
    tmp = (root / "step_0000002").rename(root / "step_0000002.tmp-2-ab12")
    assert unfinished_save_problem(str(tmp), tmp).endswith(
        f"{root} holds no complete step; start without checkpoint.load")


def test_a_published_step_is_not_an_unfinished_save(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints")
    assert unfinished_save_problem(str(root), root) is None
    assert unfinished_save_problem(str(root / "step_0000002"), root / "step_0000002") is None

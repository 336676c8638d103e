"""`checkpoint.load` naming a file offers the directory it belongs to: a step's own file (run.json,
a .distcp shard) its step directory, `latest` its root; any other file the usual root."""

from __future__ import annotations

import pytest

from tests.unit.checkpoint_damage_fixtures import load_cfg, project_root
from trainer.checkpoint.preflight import check_checkpoint_load_path, file_load_problem


@pytest.mark.parametrize("name", ["run.json", "__0_0.distcp", ".metadata", "metadata.json"])
def test_a_file_in_a_step_offers_that_step(tmp_path, name) -> None:
    step = project_root(tmp_path / "checkpoints") / "step_0000002"
    expected = (f"checkpoint.load={step / name} is a file, not a checkpoint directory; set "
                f"checkpoint.load={step}")
    assert file_load_problem(str(step / name), step / name) == expected
    assert check_checkpoint_load_path(load_cfg(step / name)) == expected


def test_latest_offers_its_root_and_other_files_the_usual_root(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints")
    assert file_load_problem(str(root / "latest"), root / "latest").endswith(
        f"set checkpoint.load={root}")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert file_load_problem(str(other), other).endswith(
        "set checkpoint.load=runs/<run>/checkpoints")
    assert file_load_problem(str(root), root) is None

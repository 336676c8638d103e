"""A path through a symbolic link that points at itself is one line naming the field, exit 2, in
every command that takes a path: Python 3.12's `Path.resolve()` raised `RuntimeError("Symlink
loop from ...")` where a rule resolved a path before looking at it (`recipes/config/links.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recipes.config.links import resolved
from recipes.config.path_rules import directory_problem
from trainer.entry.commands import COMPARE_RUNS, PREPARE_DATA, PRETRAIN
from trainer.entry.contract import main

LOOP_REASON = f"({os.strerror(40)}: "  # ELOOP


@pytest.fixture
def loop(tmp_path) -> Path:
    path = tmp_path / "loop"
    path.symlink_to(path)
    return path


def test_resolved_leaves_a_loop_as_written_and_follows_other_links(tmp_path, loop):
    assert resolved(loop) == loop and resolved(loop / "x") == loop / "x"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolved(tmp_path / "link" / "a") == tmp_path / "real" / "a"


def test_the_directory_rule_names_a_loop(loop):
    assert directory_problem("run_dir", str(loop / "sub"), "fix it") == (
        f"run_dir={loop / 'sub'} cannot be used {LOOP_REASON}{loop / 'sub'}); fix it")


@pytest.mark.parametrize(("command", "rest", "said"), [
    (PRETRAIN, ["recipe=tiny_dp1", "run_dir={loop}"],
     "error: run_dir={loop} cannot be used " + LOOP_REASON),
    (PRETRAIN, ["recipe=tiny_dp1", "output_dir={loop}"],
     "error: output_dir={loop} cannot be used " + LOOP_REASON),
    (COMPARE_RUNS, ["{loop}"], "error: {loop} has no metrics.jsonl; "),
    (PREPARE_DATA, ["input={readme}", "output={loop}/x", "tokenizer=train:300"],
     "error: output={loop}/x: cannot write {loop}/.x.work ("),
], ids=["run_dir", "output_dir", "compare_runs", "prepare_data"])
def test_a_looping_path_is_one_line(command, rest, said, loop, capsys):
    readme = Path(__file__).resolve().parents[2] / "README.md"
    args = [part.format(loop=loop, readme=readme) for part in rest]
    assert main(command, args) == 2
    err = capsys.readouterr().err
    assert err.startswith(said.format(loop=loop)) and err.count("\n") == 1, err

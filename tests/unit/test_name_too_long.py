"""A path with a name longer than the file system allows is one line naming the argument, exit 2,
in every command: Python 3.12's `Path.exists()` and `is_dir()` raise `OSError(ENAMETOOLONG)` where
they answer False for every other missing path, so any rule that looks at one met a traceback
(`trainer/entry/contract.py`, `name_too_long_line`)."""

from __future__ import annotations

import pytest

from trainer.entry.commands import COMPARE_RUNS, PLAN, PREPARE_DATA, PRETRAIN
from trainer.entry.contract import main, name_too_long_line

NAME = "a" * 300


def test_the_line_names_the_argument_whose_path_it_is():
    line = name_too_long_line(f"/x/{NAME}/run-1/config.yaml",
                              ["recipe=tiny_dp1", f"output_dir=/x/{NAME}"])
    assert line == (f"output_dir=/x/{NAME}: the file system refuses /x/{NAME}/run-1/config.yaml "
                    "as too long (its longest name is 300 bytes; most allow 255 a name and "
                    "4,095 a path); shorten it")
    assert name_too_long_line(f"/x/{NAME}", ["out=/x/a"]).startswith(f"/x/{NAME}: ")  # no match


@pytest.mark.parametrize(("command", "rest", "named"), [
    (PRETRAIN, ["recipe=tiny_dp1", "output_dir={long}"], "output_dir={long}"),
    (PRETRAIN, ["config={long}"], "config={long}"),
    (PRETRAIN, ["recipe=tiny_dp1", "data.source=blend", "data.blend={long}"],
     "data.blend={long}"),
    (COMPARE_RUNS, ["{long}"], "{long}"),
    (PREPARE_DATA, ["input={long}", "output={tmp}/o/x", "tokenizer=train:300"], "input={long}"),
    (PLAN, ["megatron_args={long}"], "megatron_args={long}"),
], ids=["output_dir", "config", "blend", "compare_runs", "prepare_data", "plan"])
def test_a_name_too_long_is_one_line_naming_its_argument(command, rest, named, tmp_path,
                                                         capsys):
    long = str(tmp_path / NAME)
    assert main(command, [part.format(long=long, tmp=tmp_path) for part in rest]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named.format(long=long)}: the file system refuses ")
    assert err.count("\n") == 1, err

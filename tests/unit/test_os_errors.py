"""OSErrors that are the user's to mend are one line, exit 2, in every command
(`trainer/entry/contract.py`, `os_error_line`): a path with a name longer than the file system
allows names the argument it came from (Python 3.12's `Path.exists()` and `is_dir()` raise
`OSError(ENAMETOOLONG)` where they answer False for every other missing path, so any rule that
looked at one met a traceback), as does a path behind a folder this user may not enter
(`PermissionError`); and a disk that fills or a quota reached while the command writes names
the command."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S
from tests.plain_user import plain_user_prefix
from trainer.entry.commands import COMPARE_RUNS, PLAN, PREPARE_DATA, PRETRAIN
from trainer.entry.contract import Command, main, name_too_long_line, permission_line

REPO = Path(__file__).resolve().parents[2]

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


def _failing_with(code: int, filename: str | None = None) -> Command:
    def run(args):
        raise OSError(code, os.strerror(code), *([filename] if filename else []))

    return Command(script="compare_runs.py", run=run)


def test_a_disk_that_fills_while_a_command_writes_is_one_line(capsys):
    """What no rule of the command turned into its own line (compare_runs' out= has its own):
    a full file system or a reached quota, met while writing."""
    assert main(_failing_with(errno.ENOSPC, "/data/x.png"), []) == 2
    assert capsys.readouterr().err == (
        "error: scripts/compare_runs.py could not finish: No space left on device writing "
        "/data/x.png; free space there (or raise the quota), or point its output at another "
        "file system, and run it again\n")
    assert main(_failing_with(errno.EDQUOT), []) == 2
    assert capsys.readouterr().err.startswith(
        "error: scripts/compare_runs.py could not finish: Disk quota exceeded; free space")


def test_a_path_closed_to_this_user_is_one_line_naming_its_argument(capsys):
    assert permission_line("/data/x/metrics.jsonl", ["recipe=tiny_dp1", "run_dir=/data/x"]) == (
        "run_dir=/data/x: permission denied on /data/x/metrics.jsonl (it, or a folder on its "
        "path, is closed to this user); open it to this user, or use a path this user can reach")
    for code in (errno.EACCES, errno.EPERM):
        assert main(_failing_with(code, "/data/x/metrics.jsonl"), []) == 2
        assert capsys.readouterr().err == "error: " + permission_line(
            "/data/x/metrics.jsonl", []) + "\n"


def test_a_config_behind_a_closed_folder_is_refused_in_one_line(tmp_path):
    """For real: Python 3.12's Path.is_file() raises PermissionError for a file behind a folder
    this user may not enter (as root, the capabilities that pass by permissions are dropped)."""
    prefix = plain_user_prefix()
    closed = tmp_path / "closed"
    closed.mkdir()
    shutil.copy(REPO / "conf" / "cluster" / "cpu_local.yaml", closed / "run.yaml")
    closed.chmod(0)
    try:
        result = subprocess.run(
            [*prefix, sys.executable, str(REPO / "scripts" / "plan.py"), "recipe=tiny_dp1",
             f"cluster={closed / 'run.yaml'}"],
            capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    finally:
        closed.chmod(0o755)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr == (f"error: cluster={closed / 'run.yaml'}: permission denied on "
                             f"{closed / 'run.yaml'} (it, or a folder on its path, is closed to "
                             "this user); open it to this user, or use a path this user can "
                             "reach\n")


def test_other_os_errors_are_not_taken_for_user_mistakes():
    with pytest.raises(OSError, match="Input/output error"):
        main(_failing_with(errno.EIO), [])


def test_the_metrics_log_names_itself_when_the_disk_fills(tmp_path, monkeypatch):
    """A write names no file: the run's line (above) then says which one could not be written."""
    import torch

    from trainer.metrics import RunReporter

    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    reporter = RunReporter(tmp_path, total_steps=1, log_interval=1, progress_bar=False)
    real_open = type(tmp_path).open

    def full(path, mode="r", *args, **kwargs):
        if mode == "a":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "open", full)
    with pytest.raises(OSError) as error:
        reporter.record("train", {"step": 1})
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC,
                                                         str(tmp_path / "metrics.jsonl"))

"""An output that cannot be written is one line before any work: compare_runs.py's `out=`
picture (a directory of that name, a folder that is a file or cannot be made;
`path_rules.output_file_problem`) and convert.py's new `out=` directory (`cli.out_problem`,
before torch and the ranks, not an OSError in rank 0 at its temporary directory). Each rule
fires alone; the scripts end with exit code 2 and one `error:` line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.path_rules import output_file_problem
from trainer.entry.commands import picture_out_problem
from trainer.interop import cli

REPO = Path(__file__).resolve().parents[2]
FIX = "the fix"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


# output_file_problem: one rule each
def test_a_directory_named_like_the_file_is_refused(tmp_path) -> None:
    (tmp_path / "c.png").mkdir()
    assert output_file_problem("out", str(tmp_path / "c.png"), FIX) == (
        f"out={tmp_path / 'c.png'} is a directory, not a file; the fix")


def test_a_folder_that_is_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "afile").write_text("")
    value = str(tmp_path / "afile" / "x.png")
    assert output_file_problem("out", value, FIX) == (
        f"out={value} cannot be written: its folder {tmp_path / 'afile'} is a file, not a "
        "directory; the fix")


def test_a_folder_under_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "afile").write_text("")
    value = str(tmp_path / "afile" / "sub" / "x.png")
    assert output_file_problem("out", value, FIX) == (
        f"out={value} cannot be written: its folder {tmp_path / 'afile' / 'sub'} cannot be "
        f"created: {tmp_path / 'afile'} is a file; the fix")


def test_a_folder_that_cannot_be_created_is_refused() -> None:
    assert output_file_problem("out", "/proc/x/y.png", FIX) == (
        "out=/proc/x/y.png cannot be written: its folder /proc/x cannot be created (under "
        "/proc: No such file or directory); the fix")


def test_a_file_that_cannot_be_opened_for_writing_is_refused(tmp_path, monkeypatch) -> None:
    """Opened for appending, as root too (whom a read-only mode does not stop: faked here)."""
    existing = tmp_path / "old.png"
    existing.write_bytes(b"kept")

    def refuse(self, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    assert output_file_problem("out", str(existing), FIX) == (
        f"out={existing} cannot be written (Permission denied); the fix")


def test_a_writable_place_passes_and_is_left_as_it_was(tmp_path) -> None:
    existing = tmp_path / "old.png"
    existing.write_bytes(b"kept")
    assert output_file_problem("out", str(existing), FIX) is None
    assert existing.read_bytes() == b"kept"
    assert output_file_problem("out", str(tmp_path / "new" / "deeper" / "c.png"), FIX) is None
    assert sorted(tmp_path.iterdir()) == [existing]  # the probed folders are gone again


def test_compare_runs_names_out_and_the_fix(tmp_path) -> None:
    (tmp_path / "afile").write_text("")
    line = picture_out_problem("out", str(tmp_path / "afile" / "x.png"))
    assert line.startswith(f"out={tmp_path / 'afile' / 'x.png'} cannot be written")
    assert line.endswith(f"; name a .png file in a folder you can write, e.g. "
                         f"out={Path.cwd() / 'compare_runs.png'}")


@pytest.mark.parametrize("out", ["afile/x.png", "made.png", "/proc/x/y.png"])
def test_compare_runs_script_refuses_before_reading_a_run(tmp_path, out) -> None:
    """One line, exit 2, before the run directory is read (it does not exist here)."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "made.png").mkdir()
    value = out if out.startswith("/") else str(tmp_path / out)
    done = _run("scripts/compare_runs.py", str(tmp_path / "no_run"), f"out={value}")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"error: out={value} ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


# convert.py's out= directory
def test_convert_out_under_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "afile").write_text("")
    assert cli.out_problem("export", tmp_path / "afile" / "sub") == (
        f"out={tmp_path / 'afile' / 'sub'} cannot be created: {tmp_path / 'afile'} is a file; "
        f"name a new directory in a folder you can write, e.g. out={Path.cwd() / 'exported'}")


def test_convert_out_that_cannot_be_created_is_refused() -> None:
    assert cli.out_problem("import", Path("/proc/nope/x")) == (
        "out=/proc/nope/x cannot be created (under /proc: No such file or directory); name a "
        f"new directory in a folder you can write, e.g. out={Path.cwd() / 'imported'}")


def test_convert_new_out_passes_and_is_not_made(tmp_path) -> None:
    assert cli.out_problem("import", tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []


def test_the_request_refuses_it_before_anything_is_read(tmp_path) -> None:
    """make_request, before the checkpoint or the HF model is looked at (neither exists)."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"^out=.*/afile/sub cannot be created: .*afile is a "
                                          r"file; name a new directory"):
        cli.make_request(["export"], {"checkpoint": str(tmp_path / "none"),
                                      "out": str(tmp_path / "afile" / "sub")})


@pytest.mark.parametrize("command, source", [("export", "checkpoint"), ("import", "hf")])
def test_convert_script_refuses_in_one_line(tmp_path, command, source) -> None:
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub"
    rest = ["recipe=hf_tiny_llama"] if command == "import" else []
    done = _run("scripts/convert.py", command, f"{source}={tmp_path}", f"out={out}", *rest)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: out={out} cannot be created: {tmp_path / 'afile'} is a file; "
                           "name a new directory in a folder you can write, e.g. "
                           f"out={REPO / (command + 'ed')}\n")

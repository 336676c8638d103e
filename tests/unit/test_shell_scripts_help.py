"""scripts/run_gpu_checks.sh and scripts/build_gpu_wheels.sh: --help prints the usage (their
comment header) and exits 0; a wrong argument, an interpreter that cannot run, or an empty
wheel folder is one `error:` line and exit 2, before any check or build starts. Nothing here
runs the GPU tier or the 20-minute build: every case stops at the scripts' first lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
GPU_CHECKS = SCRIPTS / "run_gpu_checks.sh"
WHEELS = SCRIPTS / "build_gpu_wheels.sh"


def run(script: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items()
            if k not in ("PYTHON", "WHEELS", "STEPS", "TORCH", "ARCH", "WORK")}
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env={**keep, **env},
                          capture_output=True, text=True, timeout=60)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    return lines[0]


@pytest.mark.parametrize("script", [GPU_CHECKS, WHEELS], ids=["gpu_checks", "wheels"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits_0(script, flag, tmp_path) -> None:
    done = run(script, flag, cwd=tmp_path, TORCH="2.11.0", ARCH="9.0")
    assert done.returncode == 0 and done.stderr == ""
    assert "Usage: " in done.stdout and f"bash scripts/{script.name}" in done.stdout
    assert not done.stdout.startswith(("#", "!")) and "set -" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # no output folder named --help


@pytest.mark.parametrize("script", [GPU_CHECKS, WHEELS], ids=["gpu_checks", "wheels"])
def test_an_unknown_option_is_one_line(script, tmp_path) -> None:
    line = one_error_line(run(script, "--out", cwd=tmp_path, TORCH="2.11.0", ARCH="9.0"))
    assert f"--out is not an option of {script.name}" in line and "-h/--help" in line
    assert list(tmp_path.iterdir()) == []


def test_gpu_checks_take_no_arguments(tmp_path) -> None:
    assert "extra is not an option" in one_error_line(run(GPU_CHECKS, "extra", cwd=tmp_path))


def test_build_takes_one_output_folder(tmp_path) -> None:
    line = one_error_line(run(WHEELS, "a", "b", cwd=tmp_path, TORCH="2.11.0", ARCH="9.0"))
    assert "takes one output folder, got 2" in line


def test_a_python_that_cannot_run_is_one_line_before_any_check(tmp_path) -> None:
    line = one_error_line(run(GPU_CHECKS, cwd=tmp_path, PYTHON="/nonexistent"))
    assert "PYTHON=/nonexistent cannot be run; set PYTHON" in line


def test_a_relative_python_is_taken_from_the_callers_directory(tmp_path) -> None:
    line = one_error_line(run(GPU_CHECKS, cwd=tmp_path, PYTHON="bin/python"))
    assert f"PYTHON={tmp_path}/bin/python cannot be run" in line


def test_steps_must_be_a_positive_number(tmp_path) -> None:
    assert "STEPS=abc is not a positive" in one_error_line(
        run(GPU_CHECKS, cwd=tmp_path, STEPS="abc"))


@pytest.mark.parametrize("make", [True, False], ids=["empty", "missing"])
def test_a_wheel_folder_without_wheels_is_one_line_naming_it(make, tmp_path) -> None:
    if make:
        (tmp_path / "wheels").mkdir()
    line = one_error_line(run(GPU_CHECKS, cwd=tmp_path, PYTHON=sys.executable,
                              WHEELS="wheels"))  # relative: from the caller's directory
    what = "holds no .whl files" if make else "is not a folder"
    assert f"WHEELS={tmp_path}/wheels {what}; fill it" in line
    assert f"scripts/build_gpu_wheels.sh {tmp_path}/wheels" in line


def test_build_checks_its_settings_before_creating_the_folder(tmp_path) -> None:
    line = one_error_line(run(WHEELS, "out", cwd=tmp_path, TORCH="2.11.0", ARCH="9.0",
                              PYTHON="./nope"))
    assert f"PYTHON={tmp_path}/./nope is not Python 3.12" in line
    assert list(tmp_path.iterdir()) == []


# scripts/nemotron_table.py out=: a path it cannot write is one line, not an OSError traceback.
@pytest.mark.parametrize(("out", "said"), [
    ("missing/n.md", "error: out=missing/n.md: its folder missing does not exist; create it"),
    (".", "error: out=. is a directory; give a file path such as out=nemotron.md"),
    ("notes.txt/n.md", "error: out=notes.txt/n.md: its folder notes.txt is a file, not a folder"),
])
def test_nemotron_table_refuses_an_out_it_cannot_write(out, said, tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("a file, where a folder is meant")
    done = subprocess.run([sys.executable, str(SCRIPTS / "nemotron_table.py"), f"out={out}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert one_error_line(done).startswith(said)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]

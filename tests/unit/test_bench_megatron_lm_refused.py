"""`scripts/bench_data.py megatron_lm=` that is not Megatron-LM's tools/preprocess_data.py (a
folder, a file that is not Python) is one line before the benchmark runs
(`megatron_lm_problem`), not a SyntaxError list after it; the tool alone, outside a checkout,
runs on the installed megatron-core. Each case fires alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from trainer.tools.benchmarks.data import check_options, megatron_lm_problem

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The shape of a Megatron-LM checkout: megatron/ and tools/preprocess_data.py."""
    (tmp_path / "Megatron-LM" / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "Megatron-LM" / "tools").mkdir()
    (tmp_path / "Megatron-LM" / "tools" / "preprocess_data.py").write_text("import sys\n")
    return tmp_path / "Megatron-LM"


def test_unset_passes() -> None:
    assert megatron_lm_problem(None) is None


def test_the_tool_of_a_checkout_passes(checkout) -> None:
    assert megatron_lm_problem(str(checkout / "tools" / "preprocess_data.py")) is None


def test_a_missing_file_is_refused() -> None:
    assert megatron_lm_problem("/nope").startswith(
        "megatron_lm=/nope: no such file; name tools/preprocess_data.py of a Megatron-LM")


def test_a_text_file_is_refused(tmp_path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not python ::\n")
    assert megatron_lm_problem(str(notes)) == (
        f"megatron_lm={notes} is not Megatron-LM's tools/preprocess_data.py (it cannot be read "
        "as Python: SyntaxError: invalid syntax); name that file of a Megatron-LM checkout "
        "(git clone https://github.com/NVIDIA/Megatron-LM), or leave megatron_lm unset")


def test_the_tool_alone_passes(checkout, tmp_path) -> None:
    """A copy of the one file: the `megatron` it imports is the installed megatron-core's."""
    alone = tmp_path / "preprocess_data.py"
    alone.write_bytes((checkout / "tools" / "preprocess_data.py").read_bytes())
    assert megatron_lm_problem(str(alone)) is None


def test_a_checkout_folder_is_answered_with_its_tool(checkout) -> None:
    assert megatron_lm_problem(str(checkout)) == (
        f"megatron_lm={checkout} is a folder, not Megatron-LM's tools/preprocess_data.py; name "
        f"its tool: megatron_lm={checkout / 'tools' / 'preprocess_data.py'}")


def test_another_folder_is_refused(tmp_path) -> None:
    assert megatron_lm_problem(str(tmp_path)).startswith(
        f"megatron_lm={tmp_path} is a folder, not Megatron-LM's tools/preprocess_data.py; name "
        "tools/preprocess_data.py of a Megatron-LM checkout")


def test_a_tool_that_is_not_python_is_refused(checkout) -> None:
    tool = checkout / "tools" / "preprocess_data.py"
    tool.write_bytes(b"\xff\x00 not text")
    assert megatron_lm_problem(str(tool)).startswith(
        f"megatron_lm={tool} is not Megatron-LM's tools/preprocess_data.py (it cannot be read "
        "as Python: ")


def test_check_options_raises_it(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is a folder, not Megatron-LM's"):
        check_options({"megatron_lm": str(tmp_path)})


def test_the_script_refuses_a_text_file_up_front(tmp_path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not python ::\n")
    done = subprocess.run([sys.executable, "scripts/bench_data.py", f"megatron_lm={notes}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"error: megatron_lm={notes} is not Megatron-LM's tools/")
    assert done.stderr.count("\n") == 1

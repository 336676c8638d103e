"""A tool a benchmark runs as a child and that fails: our script's `error:` line stays one line,
exit 2; any other failure is one `error:` line naming the tool, its exit and its last line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from trainer.tools.benchmarks.child_runs import child_failure

pytestmark = pytest.mark.scripts_unit

REPO = Path(__file__).resolve().parents[2]


def test_a_scripts_error_line_stays_one_line_exit_2() -> None:
    refused = child_failure("pretrain.py", 2,
                            "noise\nerror: data.blend=x: holds token ids up to 2047\n\n")
    assert isinstance(refused, ConfigError)
    assert str(refused) == "data.blend=x: holds token ids up to 2047"


def test_a_crash_is_one_error_line_naming_the_tool_and_exit_1() -> None:
    crash = child_failure("pretrain.py", 1, "Traceback ...\nRuntimeError: boom\n")
    assert isinstance(crash, SystemExit)
    assert crash.code == "error: pretrain.py failed (exit 1): RuntimeError: boom"


def test_exit_2_without_an_error_line_is_a_failure_not_a_refusal() -> None:
    """Another tool's usage message (argparse exits 2) is not one of our refusals."""
    usage = child_failure("megatron_lm=/x/preprocess_data.py", 2,
                          "usage: preprocess_data.py [-h]\npreprocess_data.py: error: --input\n")
    assert isinstance(usage, SystemExit)
    assert usage.code == ("error: megatron_lm=/x/preprocess_data.py failed (exit 2): "
                          "preprocess_data.py: error: --input")
    assert child_failure("x", -9, "").code == "error: x failed (exit -9): no output on stderr"


def test_a_megatron_lm_tool_that_fails_is_one_line_from_the_script(tmp_path) -> None:
    tool = tmp_path / "preprocess_data.py"
    tool.write_text('import sys\nprint("working", file=sys.stderr)\nsys.exit("boom: no --x")\n')
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_data.py"), "corpus=synthetic",
         "max_mb=0.01", "vocab=300", "repeats=1", "workers=1", f"megatron_lm={tool}"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: megatron_lm={tool} failed (exit 1): boom: no --x"]

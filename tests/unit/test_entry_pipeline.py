"""Every script goes through the one entry pipeline: help, own options, one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from trainer.entry.commands import BENCH_STEP, PRETRAIN
from trainer.entry.pipeline import help_text, split_options

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
RECIPE_SCRIPTS = [REPO / "scripts" / "pretrain.py", REPO / "scripts" / "bench_step.py"]


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=REPO,
        timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_works_for_every_script(script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"usage: python scripts/{script.name}" in result.stdout
    if script in RECIPE_SCRIPTS:
        assert "recipes (default stdlib_bpe_tp2_pp2):" in result.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_mistake_is_one_line_and_exit_2_for_every_script(script):
    result = run_script(script, "parallel.tensr=2")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    if script in RECIPE_SCRIPTS:
        assert "did you mean parallel.tensor" in result.stderr


def test_bench_options_are_split_from_overrides_and_checked():
    options, rest = split_options(BENCH_STEP, ["steps=7", "recipe=tiny_dp1", "optimizer.lr=1e-3"])
    assert options == {"steps": 7, "warmup": 3}
    assert rest == ["recipe=tiny_dp1", "optimizer.lr=1e-3"]
    with pytest.raises(ConfigError, match="steps=0 must be a positive whole number"):
        split_options(BENCH_STEP, ["steps=0"])
    # pretrain has no own options: steps= is an override like any other (and then unknown).
    assert split_options(PRETRAIN, ["steps=7"]) == ({}, ["steps=7"])


def test_help_lists_a_commands_own_options():
    assert "steps=N  measured rounds of each step (default 20)" in help_text(BENCH_STEP)
    assert "options:" not in help_text(PRETRAIN)

"""A run in phases fits when each of its launches does: the planner says so per phase, and
scripts/launch.py and pretrain.py refuse a later phase that cannot fit before anything starts
(not at its relaunch, after the phases before it have trained)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.plan.command import run_plan
from recipes.plan.fit import phase_fit_problems
from recipes.resolve import resolve_config
from trainer.entry.commands import LAUNCH
from trainer.entry.contract import parse_arguments
from trainer.launch.cluster import launch_args, plan_launch

REPO = Path(__file__).resolve().parents[2]
TINY = ["recipe=tiny_dp2", "data.source=synthetic", "train.train_iters=6",
        "scheduler.warmup_iters=1", "model.seq_length=32"]
# A first phase of 32-token rows, then a relaunch in 131,072-token rows: megabytes, then GBs.
PHASED = [*TINY, "phases=[{name: short, end_step: 3, seq_length: 32}, "
          "{name: long, end_step: 6, seq_length: 131072, relaunch: true}]"]
BOTH_SHORT = [*TINY, "phases=[{name: short, end_step: 3, seq_length: 32}, "
              "{name: long, end_step: 6, seq_length: 64, relaunch: true}]"]
ONE_GIB = "cluster.gpu_memory_gib=1"


def test_the_rule_refuses_a_later_phase_alone_and_only_what_is_left():
    cfg = resolve_config([*PHASED, ONE_GIB])
    [line] = phase_fit_problems(cfg)
    assert line.startswith("phases[1] (long), the launch from step 3 with "
                           "model.seq_length=131072 parallel.context=1 ")
    assert "cannot fit: model.seq_length=131072 needs " in line
    assert "but a GPU has 1.07 GB (cluster.gpu_memory_gib)" in line
    assert "fits at most" in line  # the planner's fix
    assert phase_fit_problems(cfg, from_step=6) == []  # resumed past it: nothing left to check
    assert phase_fit_problems(resolve_config([*BOTH_SHORT, ONE_GIB])) == []


def test_the_planner_says_per_phase_whether_it_fits(capsys):
    assert run_plan([*PHASED, ONE_GIB], {}) == 0
    out = capsys.readouterr().out
    assert "phases: 2 launches, each in its phase's layout:" in out
    [short] = [line for line in out.splitlines() if line.startswith("  short (steps 0-3")]
    [long] = [line for line in out.splitlines() if line.startswith("  long (steps 3-6")]
    assert short.endswith(": fits") and "seq 32," in short
    assert long.endswith(": does NOT fit") and "seq 131,072," in long
    assert "    model.seq_length=131072 needs " in out  # its refusal, with the fix
    assert run_plan([*PHASED, ONE_GIB], {}, as_json=True) == 0
    phases = json.loads(capsys.readouterr().out)["phases"]
    assert [(p["phase"], p["fits"]) for p in phases] == [("short", True), ("long", False)]
    assert run_plan([*TINY, ONE_GIB], {}) == 0  # no phases: no phase lines
    assert "phases:" not in capsys.readouterr().out


def _cluster_file(tmp_path: Path, gb: int) -> Path:
    text = (REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml").read_text()
    path = tmp_path / "small.yaml"
    path.write_text(text.replace("gpu_memory_gb: 80", f"gpu_memory_gb: {gb}"))
    return path


def _launch(argv: list[str], tmp_path: Path):
    args = parse_arguments(LAUNCH, [*argv, "--dry-run", f"job_dir={tmp_path / 'jobs'}"])
    return plan_launch(launch_args(args.options, args.flags, args.rest))


def test_launch_refuses_a_phase_job_that_cannot_fit_before_submitting(tmp_path):
    cluster = f"cluster={_cluster_file(tmp_path, 1)}"
    assert _launch([*BOTH_SHORT, cluster], tmp_path).cfg.phases  # both fit: accepted
    with pytest.raises(ConfigError) as refused:
        _launch([*PHASED, cluster], tmp_path)
    [line] = str(refused.value).splitlines()
    assert line.startswith("phases[1] (long), the launch from step 3 with ")
    assert "needs " in line and "but a GPU has 1.00 GB (cluster.gpu_memory_gib)" in line


def test_pretrain_refuses_a_later_phase_that_cannot_fit_before_any_rank(tmp_path):
    """On CPU ranks against this machine's memory: 1M-token rows of explicit attention keep
    terabytes of scores, which no machine's memory holds."""
    argv = ["recipe=tiny_dp1", *TINY[1:], f"output_dir={tmp_path}",
            "phases=[{name: short, end_step: 3, seq_length: 32}, "
            "{name: long, end_step: 6, seq_length: 1048576, relaunch: true}]"]
    done = subprocess.run([sys.executable, "scripts/pretrain.py", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: phases[1] (long), the launch from step 3 with "
                                  "model.seq_length=1048576 ")
    assert "this machine's memory per CPU rank" in done.stderr
    assert "launching" not in done.stdout  # no rank started

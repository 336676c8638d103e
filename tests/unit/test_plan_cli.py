"""scripts/plan.py end to end: text, --json, cluster files, and one-line refusals (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "plan.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=HANG_S)


def test_text_plan_of_config_b():
    result = plan("recipe=8b_tp8_pp4_dp2", "cluster=conf/cluster/h100_80gb_8x8.yaml")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "fits" in out and "N0: p0t0d0" in out and "bubble: 1F1B 27.3%" in out
    assert "2 x DP2 x 8 accumulation = 32 sequences" in out
    assert "pp            16 groups of 4     16 cross nodes" in out


def test_json_plan_has_every_group():
    result = plan("recipe=8b_tp8_dp8", "--json", "tokens=1e9")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] and data["world_size"] == 64 and data["batch"]["global_batch"] == 128
    tp = next(g for g in data["groups"] if g["kind"] == "tp")
    assert len(tp["groups"]) == tp["count"] == 8 and tp["crossing"] == 0
    assert tp["groups"][3] == "N3:G0-G7"
    dp = next(g for g in data["groups"] if g["kind"] == "dp")
    assert dp["groups"][0] == " ".join(f"N{n}:G0" for n in range(8))
    assert data["batch"]["steps"] == -(-10**9 // (128 * 8192))


def test_a_layout_that_does_not_fit_names_contributors_and_fixes():
    result = plan("recipe=llama3_70b_tp4_pp4_cp2_vpp5_dp2", "train.micro_batch_size=4",
                  "train.global_batch_size=256")
    assert result.returncode == 0, result.stderr
    assert "does NOT fit" in result.stdout
    assert "train.recompute=full" in result.stdout and "fits" in result.stdout


def test_cpu_cluster_plans_tiny_recipe_with_explicit_attention():
    result = plan("recipe=tiny_tp2_pp2", "cluster=conf/cluster/cpu_local.yaml")
    assert result.returncode == 0, result.stderr
    assert "explicit attention" in result.stdout and "fits" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["recipe=tiny_dp1", "cluster=conf/cluster/nope.yaml"], "cluster=conf/cluster/nope.yaml"),
    (["recipe=tiny_dp1", "sharding=zero9"], "sharding expects one of none, dist_opt, optim"),
    (["recipe=tiny_dp1", "offload=maybe"], "offload expects true or false, got 'maybe'"),
    (["recipe=tiny_dp1", "tokens=-3"], "tokens=-3 must be a positive whole number"),
    (["recipe=tiny_dp1", "model.num_layers=5", "parallel.pipeline=2",
      "cluster.gpus_per_node=2"], "model.num_layers=5"),
    (["recipe=8b_tp8_dp8", "cluster=conf/cluster/cpu_local.yaml"], None),
])
def test_mistakes_are_one_line(args, message):
    result = plan(*args)
    if message is None:  # 64 ranks fill 16 CPU "nodes" of 4: allowed
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_help_lists_the_options():
    result = plan("--help")
    assert result.returncode == 0 and "sharding=" in result.stdout and "recipes" in result.stdout

"""The step model's host-cores term: CPU ranks share their node's cores, so with more ranks
than cores a node's step is at least its ranks' compute spread over the cores plus the exposed
communication; with no more ranks than cores, or no `host_cores` (every GPU file), the model is
the per-rank one, unchanged. The cluster key is checked in one line."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.steptime import host_cores_bound, step_time
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "conf" / "cluster" / "cpu_local.yaml"


def _time(recipe: str, host_cores: int | None, *overrides: str):
    cfg = resolve_config([f"recipe={recipe}", *overrides])
    cluster = load_cluster(CPU)
    cfg = apply_cluster(cfg, cluster)
    stages = stage_plans(cfg, cluster, PlanOptions(listed_groups=0))
    return step_time(cfg, stages, cluster.peak_tflops["fp32"], kernel_s=3e-4, latency_s=5e-3,
                     host_cores=host_cores)


def test_the_bound_spreads_the_ranks_compute_over_the_cores():
    assert host_cores_bound([1.0, 1.0, 2.0, 2.0], 0.5, 2) == 3.0 + 0.5
    assert host_cores_bound([1.0, 1.0], 0.5, 2) == 0.0  # a core per rank: no bound
    assert host_cores_bound([1.0, 1.0, 1.0], 0.5, None) == 0.0  # cores unknown


DP4 = ("parallel.tensor=1", "parallel.pipeline=1")  # tiny_tp2_pp2's 4 ranks as DP4


def test_it_binds_with_four_ranks_on_two_cores():
    alone, shared = _time("tiny_tp2_pp2", None, *DP4), _time("tiny_tp2_pp2", 2, *DP4)
    assert alone.cores == 0.0 and shared.cores > 0.0
    # four equal DP ranks on two cores: twice one rank's compute, plus the exposed DP reduce
    assert shared.total == pytest.approx(2 * alone.compute + alone.dp)
    assert dataclasses.replace(shared, cores=0.0) == alone  # the other terms are kept


def test_the_bubble_lends_its_core_to_the_other_stages():
    pp4 = ("parallel.tensor=1", "parallel.pipeline=4")
    # one micro-batch over four stages: each rank idles three of its four slots, time enough
    # for the others to use its core, so the per-rank model (compute + bubble) stands
    one = _time("tiny_tp2_pp2", 2, *pp4, "train.micro_batch_size=8")
    assert one.bubble == pytest.approx(3 * one.compute) and one.cores == 0.0
    # eight micro-batches: the bubble is short and the four stages' compute shares two cores
    eight = _time("tiny_tp2_pp2", 2, *pp4, "train.micro_batch_size=1")
    assert eight.cores > 0.0


def test_it_does_not_bind_with_two_ranks_on_two_cores():
    assert _time("tiny_dp2", 2) == _time("tiny_dp2", None)
    assert _time("tiny_dp2", 2).cores == 0.0


def test_a_gpu_cluster_file_has_no_host_cores_and_keeps_its_predictions():
    h100 = load_cluster(REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml")
    assert h100.host_cores is None and load_cluster(CPU).host_cores is None
    assert _time("tiny_tp2_pp2", None).cores == 0.0


@pytest.mark.parametrize(("line", "message"), [
    ("host_cores: 0", "host_cores=0 must be a positive whole number"),
    ("host_cores: 1.5", "host_cores=1.5 must be a positive whole number"),
    ("host_cores: two", "host_cores='two' must be a positive whole number"),
])
def test_host_cores_must_be_a_positive_whole_number(tmp_path, line, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CPU.read_text() + line + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        load_cluster(bad)
    assert "\n" not in str(error.value)
    good = tmp_path / "good.yaml"
    good.write_text(CPU.read_text() + "host_cores: 2\n")
    assert load_cluster(good).host_cores == 2


def test_host_cores_is_refused_in_a_gpu_file(tmp_path):
    bad = tmp_path / "gpu.yaml"
    bad.write_text((REPO / "conf" / "cluster" / "h200_1x8.yaml").read_text()
                   + "host_cores: 16\n")
    with pytest.raises(ConfigError, match="host_cores=16 is for CPU ranks; add device: cpu"):
        load_cluster(bad)


def test_the_search_names_the_bound_when_it_binds(tmp_path):
    from recipes.plan.search import search
    from recipes.plan.search_report import text_search

    path = tmp_path / "cpu.yaml"
    path.write_text(CPU.read_text() + "kernel_overhead_us: 300\nhost_cores: 2\n")
    cluster = load_cluster(path)
    cfg = apply_cluster(resolve_config(["recipe=tiny_tp2_pp2"]), cluster)
    result = search(cfg, cluster, top=10)
    text = text_search(cfg, cluster, result)
    assert any(e.time.cores > 0 for e in result.listed)
    assert "the host-cores bound binds (4 ranks on 2 cores per node)" in text
    assert "   cores  lost to #1 by" in text
    plain = load_cluster(CPU)
    plain_text = text_search(cfg, plain, search(cfg, plain, top=10))
    assert "cores" not in plain_text.split("best of what lost")[0]

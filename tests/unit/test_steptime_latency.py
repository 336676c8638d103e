"""The step model's latency term: every collective a layout starts costs the cluster file's
per-message latency, so layouts that send many small messages (TP, PP) rank behind those that
send few, and a file without the figure prices none (the model as before)."""

from __future__ import annotations

import dataclasses

import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.steptime import collective_counts, step_time
from recipes.resolve import resolve_config

CPU = "conf/cluster/cpu_local.yaml"


def _time(recipe: str, latency_s: float):
    cfg = resolve_config([f"recipe={recipe}"])
    cluster = load_cluster(CPU)
    stages = stage_plans(cfg, cluster, PlanOptions(listed_groups=0))
    return step_time(cfg, stages, cluster.peak_tflops["fp32"], latency_s=latency_s)


def _counts(recipe: str) -> dict[str, float]:
    cfg = resolve_config([f"recipe={recipe}"])
    (stage,) = stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0))
    return collective_counts(stage)


def test_counts_follow_the_layout():
    tp, dp = _counts("tiny_tp2"), _counts("tiny_dp2")
    # TP2, 4 micro-batches of 4 layers: 2 forward + 2 backward all-reduces per layer, and per
    # micro-batch the output layer's backward all-reduce and the unfused loss's three (CPU)
    assert tp["tp"] == 4 * 4 * 4 + 4 * (1 + 3) and tp["pp"] == tp["dp-cp"] == 0
    assert dp["tp"] == 0 and dp["dp-cp"] == 1


def test_latency_is_added_per_collective_and_off_without_the_figure():
    none, priced = _time("tiny_tp2", 0.0), _time("tiny_tp2", 1e-3)
    # 80 collectives; the column-parallel backward's 36 (QKV's and FC1's of 4 layers and the
    # output layer's, 4 micro-batches) hide their latency too, as far as their GEMMs last
    assert (80 - 36) * 1e-3 < priced.tp - none.tp < 80 * 1e-3
    assert dataclasses.replace(priced, tp=none.tp) == none
    # TP2 starts 80 collectives a step, DP2 one: with latency DP2 ranks ahead
    assert _time("tiny_dp2", 1e-3).total < priced.total


def test_kernel_overhead_charges_many_small_micro_batches():
    cfg = resolve_config(["recipe=tiny_dp2"])
    cluster = load_cluster(CPU)

    def total(micro_batch: int, kernel_s: float) -> float:
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                               micro_batch_size=micro_batch))
        stages = stage_plans(c, cluster, PlanOptions(listed_groups=0))
        return step_time(c, stages, cluster.peak_tflops["fp32"], kernel_s=kernel_s).compute

    # 4 micro-batches of 1 run twice the kernels of 2 of 2: 4 layers x 24 kernels x 3 passes
    extra = total(1, 1e-3) - total(1, 0.0)
    assert extra == pytest.approx(4 * 4 * 24 * 3 * 1e-3)
    assert extra == pytest.approx(2 * (total(2, 1e-3) - total(2, 0.0)))

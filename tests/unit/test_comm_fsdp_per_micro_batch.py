"""Megatron FSDP's DP traffic, one formula for the plan's table and the step model
(`comm.dp_passes`): with gradients sharded every micro-batch reduce-scatters its own, with
weights sharded too every micro-batch gathers them for its forward and again for its
backward; the step model splits reduce from gather by the table's rows, so FP8 weights
gathered at one byte shrink the gathers only, and counts the collectives the table sends."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp as megatron_fsdp
import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.comm import dp_passes
from recipes.plan.steptime import collective_counts, step_time
from recipes.resolve import resolve_config

H100 = "conf/cluster/h100_80gb_8x8.yaml"


def _stage(*overrides, options=None):
    cfg = resolve_config(["recipe=llama3_8b_fsdp_dp8", f"cluster.spec={H100}", *overrides])
    cluster = load_cluster(H100)
    (stage,) = stage_plans(cfg, cluster, options or PlanOptions(listed_groups=0))
    return cfg, cluster, stage


def _dp(stage, weights: bool):
    return [t for t in stage.traffic if t.group == "dp-cp" and t.weights == weights]


def test_megatron_fsdp_reduces_every_micro_batch_when_gradients_are_sharded():
    """The source the rule cites (Megatron Core 0.19.2): the reduce-scatter is gated by the
    strategy, not by no_sync, and ZeRO-3 gathers before forward and before backward."""
    text = Path(megatron_fsdp.__file__).read_text()
    assert ('grad_reduce_every_bprop = self.data_parallel_sharding_strategy in [\n'
            '                "optim_grads",\n                "optim_grads_params",\n') in text
    assert "def _pre_forward_param_unshard" in text
    assert "def _pre_backward_param_unshard" in text
    assert dp_passes("optim_grads_params", 16) == (16, 32)
    assert dp_passes("optim_grads", 16) == (16, 1)
    assert dp_passes("optim", 16) == dp_passes("dist_opt", 16) == (1, 1)
    assert dp_passes("none", 16) == (1, 0)


def test_zero3_table_sends_a_reduce_per_micro_batch_and_two_gathers():
    cfg, _, zero3 = _stage()
    _, _, zero1 = _stage("optimizer.fsdp=none")
    micro = cfg.layout.microbatches
    assert micro == 16
    [reduce3], [gather3] = _dp(zero3, False), _dp(zero3, True)
    [reduce1], [gather1] = _dp(zero1, False), _dp(zero1, True)
    assert reduce3.bytes_sent == pytest.approx(micro * reduce1.bytes_sent)
    assert gather3.bytes_sent == pytest.approx(2 * micro * gather1.bytes_sent)
    assert (reduce3.passes, gather3.passes) == (16, 32)
    assert reduce3.operation == "reduce-scatter, 16 a step"
    assert gather3.operation == "all-gather, 32 a step"
    assert collective_counts(zero3)["dp-cp"] == 16 + 32
    assert collective_counts(zero1)["dp-cp"] == 2


def test_fp8_gathers_shrink_the_gathers_the_step_model_prices_not_the_reduces():
    """Nothing overlapped but the ZeRO-3 gathers after the first (behind the step's compute):
    the exposed DP time is exactly the table's reduce-scatters and one of its gathers, each
    with its own bytes (the FP8 weights gather in about half what the gradients reduce)."""
    cfg, cluster, stage = _stage("optimizer.overlap_grad_reduce=false",
                                 "optimizer.overlap_param_gather=false")
    [reduce], [gather] = _dp(stage, False), _dp(stage, True)
    assert gather.bytes_sent / gather.passes < 0.6 * reduce.bytes_sent / reduce.passes
    time = step_time(cfg, [stage], cluster.peak_tflops[cfg.precision.dtype])
    assert time.dp == pytest.approx(reduce.seconds + gather.seconds / gather.passes)


def test_the_sharding_option_names_the_dp_collectives():
    """`sharding=` handed through as a name prices that level's collectives."""
    from recipes.plan.comm import crossing_kinds, stage_traffic

    cfg, cluster, stage = _stage("optimizer.fsdp=none")
    rows = stage_traffic(cfg, cluster, crossing_kinds(cfg.layout), 0, stage.params,
                         "optim_grads_params")
    assert [t.passes for t in rows if t.group == "dp-cp"] == [16, 32]
    plain = stage_traffic(cfg, cluster, crossing_kinds(cfg.layout), 0, stage.params,
                         "dist_opt")
    assert [t.passes for t in plain if t.group == "dp-cp"] == [1, 1]
    assert dataclasses.replace(cfg.optimizer).fsdp == "none"

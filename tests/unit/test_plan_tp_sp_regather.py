"""With sequence parallel, a column-parallel linear's backward gathers its input over the
sequence again for the weight gradient, before the input-gradient GEMM and once per backward
(Megatron's `LinearWithGradAccumulationAndAsyncCommunication.backward`): the planner's TP row
counts it for QKV and FC1 beside the sublayers' forward and backward collectives, and names it
with the input gradient's reduce-scatter as the part the column backward may hide. The
expected figures are worked out here from the layout and Megatron's schedule."""

from __future__ import annotations

import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.comm import OUTPUT_LAYERS
from recipes.resolve import resolve_config

CPU = "conf/cluster/cpu_local.yaml"
WIDTH = {"fp32": 4, "bf16": 2}


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_sp_counts_each_column_linears_input_regather_once_a_backward(recompute):
    """tiny_tp2_pp2 (4 GPT layers, 2 a stage) on TP2 + SP. Per layer and micro-batch each of
    the 2 sublayers gathers and reduce-scatters in the forward (2 x ring x B, 2 collectives)
    and again in the backward, and again in a recomputed forward; QKV's and FC1's backward
    each gather their input again (ring x B, 1), however often the forward ran."""
    cfg = resolve_config(["recipe=tiny_tp2_pp2", "parallel.sequence_parallel=true",
                          f"train.recompute={recompute}"])
    layout, m = cfg.layout, cfg.model
    tokens = cfg.train.micro_batch_size * m.seq_length / layout.context
    rb = (layout.tensor - 1) / layout.tensor * tokens * m.hidden_size * WIDTH[cfg.precision.dtype]
    passes = 2 + (recompute == "full")  # forward, backward, a recomputed forward
    layers, micro = m.num_layers // layout.pipeline, layout.microbatches
    for stage in stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0)):
        rows = [t for t in stage.traffic if t.group == "tp" and t.operation != OUTPUT_LAYERS]
        assert sum(t.bytes_sent for t in rows) == pytest.approx(
            layers * micro * (2 * passes * 2 * rb + 2 * rb))
        assert sum(t.collectives for t in rows) == layers * micro * (2 * passes * 2 + 2)
        hideable = sorted((h.linear, h.bytes_sent, h.collectives)
                          for t in rows for h in t.hideable)
        # per column sublayer and micro-batch: the input gradient's reduce-scatter + re-gather
        assert hideable == [(kind, pytest.approx(layers * micro * 2 * rb), layers * micro * 2)
                            for kind in sorted(("*", "-"))]

"""The step model's TP term: a column-parallel linear's backward (QKV, FC1, a Mamba layer's
in_proj, the output layer, an MTP depth's input projection) launches its input-gradient reduce
and, with SP, its input's re-gather asynchronously, so each hides behind one of the linear's
backward GEMMs and is exposed only beyond it; the forward's collectives, the row-parallel
backward's gather, a recomputed forward's and an MoE layer's stay exposed; under
`parallel.tp_comm_overlap` the userbuffers model stands alone. The expected figures are worked
out here from the layout and Megatron's schedule, not read back from the traffic's split."""

from __future__ import annotations

import dataclasses

import pytest

from recipes.models.hybrid import pattern as hybrid
from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.flops import FlopsShape
from recipes.plan.steptime import step_time
from recipes.resolve import resolve_config

CPU = "conf/cluster/cpu_local.yaml"  # 5 GB/s inside a node; no latency figure
LONG = 1e-3  # TFLOP/s: every GEMM outlasts every collective beside it
SHORT = 1.0  # TFLOP/s: every column-parallel GEMM is shorter than its collective
WIDTH = {"fp32": 4, "bf16": 2}


def _plan(recipe: str, *overrides: str):
    cfg = resolve_config([f"recipe={recipe}", *overrides])
    cluster = load_cluster(CPU)
    (stage,) = stage_plans(cfg, cluster, PlanOptions(listed_groups=0))
    return cfg, stage, cluster.intra_node_gb_per_s * 1e9


def _tp(cfg, stage, peak: float) -> tuple[float, float]:
    """(the traffic's TP seconds, the step's TP term) at `peak` TFLOP/s, FLOPs / peak a GEMM."""
    total = sum(t.seconds for t in stage.traffic if t.group == "tp")
    return total, step_time(cfg, [stage], peak, peak_fraction=1.0, half_dim=0.0).tp


def _sizes(cfg) -> tuple[float, float, float]:
    """(tokens a micro-batch, B: their hidden states' bytes, ring share (n-1)/n)."""
    layout = cfg.layout
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length / layout.context
    size = tokens * cfg.model.hidden_size * WIDTH[cfg.precision.dtype]
    return tokens, size, (layout.tensor - 1) / layout.tensor


def _loss(tokens: float, ring: float) -> float:
    """A head's vocabulary-parallel loss: three FP32 values a token, all-reduced."""
    return 2 * ring * 3 * tokens * 4


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_with_long_gemms_only_the_forward_row_backward_and_recomputed_collectives_show(
        sp, recompute):
    """tiny_tp2 (4 GPT layers, 4 micro-batches, one head). A sublayer's forward reduces (an
    all-reduce, or with SP a gather and a reduce-scatter: 2 x ring x B), a recomputed forward
    again; its backward's all-reduce is the column-parallel linear's (hidden), with SP its
    gather the row-parallel one's (exposed: ring x B) and its reduce-scatter the column one's
    (hidden), which also gathers its input again for the weight gradient (hidden: once a
    backward, however often the forward reruns). The head's forward gathers its input (SP)
    and its loss all-reduces: exposed."""
    cfg, stage, bandwidth = _plan("tiny_tp2", f"parallel.sequence_parallel={sp}".lower(),
                                  f"train.recompute={recompute}")
    tokens, size, ring = _sizes(cfg)
    sublayers, forwards = 2 * cfg.model.num_layers, 1 + (recompute == "full")
    row_backward = ring * size if sp else 0.0
    per_micro = (sublayers * (forwards * 2 * ring * size + row_backward)
                 + row_backward + _loss(tokens, ring))
    total, tp = _tp(cfg, stage, LONG)
    assert tp < total
    assert tp == pytest.approx(cfg.layout.microbatches * per_micro / bandwidth, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_with_short_gemms_each_collective_hides_only_one_gemms_time(sp):
    """Each column-parallel collective hides behind one forward GEMM's time of its linear (the
    backward's input- and weight-gradient GEMMs each take that long): per layer and
    micro-batch QKV's and FC1's gradient reduce, per head the output layer's; with SP each of
    these linears also re-gathers its input (Megatron launches it before the input-gradient
    GEMM, the reduce-scatter before the weight-gradient one), so two GEMMs' time each."""
    cfg, stage, bandwidth = _plan("tiny_tp2", f"parallel.sequence_parallel={sp}".lower())
    s, layout = FlopsShape.from_config(cfg), cfg.layout
    tokens, size, ring = _sizes(cfg)
    h, tp, peak = s.hidden_size, layout.tensor, SHORT * 1e12
    width = 2 if s.gated else 1  # FC1's matrices: gate and up, or one
    qkv = 2 * tokens * h * (s.num_attention_heads + 2 * s.num_query_groups) * s.kv_channels
    fc1 = 2 * tokens * h * width * s.ffn_hidden_size
    logits = 2 * tokens * h * layout.padded_vocab
    qkv, fc1, logits = (flops / tp / peak for flops in (qkv, fc1, logits))
    reduce = (1 if sp else 2) * ring * size / bandwidth  # a reduce-scatter or an all-reduce
    assert max(qkv, fc1, logits) < reduce  # every GEMM is shorter than what it hides
    each = 2 if sp else 1  # re-gather and reduce-scatter, or the all-reduce
    hidden = layout.microbatches * each * (cfg.model.num_layers * (qkv + fc1) + logits)
    total, tp = _tp(cfg, stage, SHORT)
    assert total - tp == pytest.approx(hidden, rel=1e-9)


def test_a_hybrid_hides_its_in_proj_qkv_shared_fc1_projection_and_heads():
    """super_tiny_tp2_sp: MEM*EME and two `*E` MTP depths on TP2 + SP, one stage. Mamba,
    attention and MoE sublayers (an MoE layer's through its shared experts, a TP-split MLP;
    its routed experts' expert-TP collectives are the dispatcher's, not TP's) expose their
    forward's gather and reduce-scatter and the row-parallel backward's gather (3 x ring x B);
    Mamba's in_proj, QKV
    and the shared experts' FC1 hide their input gradient's reduce-scatter and their input's
    re-gather; a depth's input projection exposes its forward (a 2·hidden-wide gather
    and the output's: 3 x ring x B) and its output's gradient gather (ring x B), hiding the
    2·hidden-wide input gradient's reduce-scatter and input's re-gather; each of the three
    heads exposes its input's gather and its loss, and each depth its acceptance count's
    gathers of max and index."""
    cfg, stage, bandwidth = _plan("super_tiny_tp2_sp")
    m = cfg.model
    tokens, size, ring = _sizes(cfg)
    depths = hybrid.mtp_depths(m.hybrid_layer_pattern)
    column = sum(hybrid.count(m, k) + hybrid.mtp_count(m, k) for k in "M*E")
    assert (column, depths) == (11, 2) and m.moe_shared_expert_ffn_hidden_size
    # the routed experts' expert-TP gathers are the dispatcher's, timed with EP
    assert any(t.group == "expert-tp" for t in stage.traffic)
    rb = ring * size
    argmax = (cfg.layout.tensor - 1) * tokens * (WIDTH[cfg.precision.dtype] + 8)
    per_micro = (column * 3 * rb + depths * (3 * rb + rb)
                 + (1 + depths) * (rb + _loss(tokens, ring)) + depths * argmax)
    total, tp = _tp(cfg, stage, LONG)
    assert tp == pytest.approx(cfg.layout.microbatches * per_micro / bandwidth, rel=1e-12)


def test_userbuffers_overlap_keeps_its_own_model_without_the_column_backwards_on_top():
    """`parallel.tp_comm_overlap`: TP less the layers' GEMMs, forward and backward of every
    micro-batch (3 x their forward), and nothing more; without it the column-parallel backward
    hides its own part."""
    cfg, stage, _ = _plan("tiny_tp2", "parallel.sequence_parallel=true")
    s, layout = FlopsShape.from_config(cfg), cfg.layout
    tokens = _sizes(cfg)[0]
    h, q = s.hidden_size, s.num_attention_heads * s.kv_channels
    kv = s.num_query_groups * s.kv_channels
    per_layer = 2 * tokens * h * (q + 2 * kv + q + (3 if s.gated else 2) * s.ffn_hidden_size)
    gemms = 3 * layout.microbatches * cfg.model.num_layers * per_layer / layout.tensor
    gemms /= SHORT * 1e12
    total, off = _tp(cfg, stage, SHORT)
    on_cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel,
                                                                   tp_comm_overlap=True))
    on = step_time(on_cfg, [stage], SHORT, peak_fraction=1.0, half_dim=0.0).tp
    assert 0.0 < on == pytest.approx(total - gemms, rel=1e-9)
    assert off < total


def test_under_megatron_fsdp_the_column_backward_hides_nothing():
    """Megatron FSDP runs without CUDA_DEVICE_MAX_CONNECTIONS=1, the ordering the column
    backward's overlap relies on: every TP collective is exposed."""
    cfg, stage, _ = _plan("tiny_tp2", "parallel.sequence_parallel=true",
                          "optimizer.distributed=true", "optimizer.fsdp=optim_grads_params")
    total, tp = _tp(cfg, stage, LONG)
    assert tp == pytest.approx(total, rel=1e-12)


def test_a_hidden_collectives_latency_hides_with_it():
    """With a per-collective latency, a column collective's time is its bytes' and its
    latency, and with long GEMMs both hide: the TP term grows by the latency of the exposed
    collectives only (all of them less the column backward's)."""
    cfg, stage, _ = _plan("tiny_tp2", "parallel.sequence_parallel=true")
    latency = 1e-4
    plain = step_time(cfg, [stage], LONG, peak_fraction=1.0, half_dim=0.0).tp
    timed = step_time(cfg, [stage], LONG, peak_fraction=1.0, half_dim=0.0,
                      latency_s=latency).tp
    started = sum(t.collectives for t in stage.traffic if t.group == "tp")
    # a layer's QKV and FC1 each reduce-scatter their input's gradient and re-gather their
    # input, the head's output layer likewise: 4 a layer and 2 a micro-batch
    hidden = cfg.layout.microbatches * (4 * cfg.model.num_layers + 2)
    assert 0 < hidden < started
    assert timed - plain == pytest.approx((started - hidden) * latency, rel=1e-9)

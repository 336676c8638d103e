"""An MoE layer's TP traffic, as Megatron Core sends it: its tokens reach the routed experts
split over TP (sequence parallel, which `MoELayer` requires with TP), so without shared experts
the layer sends nothing over TP; its shared experts are a TP-split MLP (a dense MLP's
collectives, the FC1 backward's re-gather included); and at expert TP > 1 the all-to-all token
dispatcher gathers the routed tokens over expert TP after the exchange and reduce-scatters the
experts' output before the combine (`MoEAlltoAllTokenDispatcher.token_dispatch` /
`token_combine`, mirrored in the backward), which the step model times with EP."""

from __future__ import annotations

import pytest

from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.comm import EXPERT_TP, OUTPUT_LAYERS
from recipes.plan.steptime import step_time
from recipes.resolve import resolve_config

CPU = "conf/cluster/cpu_local.yaml"
TP2 = ("recipe=mixtral_tiny_ep2_dp2", "parallel.tensor=2", "parallel.sequence_parallel=true",
       "cluster.gpus_per_node=8")


def _plan(*overrides: str):
    cfg = resolve_config([*TP2, *overrides])
    (stage,) = stage_plans(cfg, load_cluster(CPU), PlanOptions(listed_groups=0))
    return cfg, stage


def _rows(stage, group: str, skip: str | None = None) -> tuple[float, float]:
    rows = [t for t in stage.traffic if t.group == group and t.operation != skip]
    return sum(t.bytes_sent for t in rows), sum(t.collectives for t in rows)


def _ring_hidden(cfg) -> tuple[float, float]:
    """(tokens a rank's micro-batch holds before SP, (n-1)/n of its hidden states' bytes)."""
    layout, m = cfg.layout, cfg.model
    tokens = cfg.train.micro_batch_size * m.seq_length / layout.context
    size = tokens * m.hidden_size * {"fp32": 4, "bf16": 2}[cfg.precision.dtype]
    return tokens, (layout.tensor - 1) / layout.tensor * size


def test_an_moe_layer_without_shared_experts_sends_nothing_over_tp():
    """Per layer and micro-batch only the attention sublayer: a gather and a reduce-scatter
    forward and backward, and QKV's input gathered again for its weight gradient."""
    cfg, stage = _plan("parallel.expert_tensor=1")
    assert not cfg.model.moe_shared_expert_ffn_hidden_size
    _, rb = _ring_hidden(cfg)
    sent, started = _rows(stage, "tp", skip=OUTPUT_LAYERS)
    layers, micro = cfg.model.num_layers, cfg.layout.microbatches
    assert started == micro * layers * (4 + 1)
    assert sent == pytest.approx(micro * layers * (4 + 1) * rb)


def test_shared_experts_send_a_dense_mlps_tp_collectives():
    cfg, stage = _plan("parallel.expert_tensor=1", "model.moe_shared_expert_ffn_hidden_size=96")
    _, rb = _ring_hidden(cfg)
    sent, started = _rows(stage, "tp", skip=OUTPUT_LAYERS)
    layers, micro = cfg.model.num_layers, cfg.layout.microbatches
    assert started == micro * layers * 2 * (4 + 1)
    assert sent == pytest.approx(micro * layers * 2 * (4 + 1) * rb)
    hidden = [h.linear for t in stage.traffic for h in t.hideable]
    assert "E" in hidden  # the shared FC1's backward collectives may hide behind its GEMMs


def test_expert_tp_gathers_the_routed_tokens_after_the_exchange():
    """At expert TP 2 each rank holds tokens / TP x top-k routed copies after the exchange; a
    gather or reduce-scatter over expert TP moves (n-1)/n of an expert-TP times larger
    buffer, four times per MoE layer and micro-batch (dispatch and combine, forward and
    backward); at expert TP 1 there is none."""
    cfg, stage = _plan("parallel.expert_tensor=null")
    layout, m = cfg.layout, cfg.model
    etp = layout.expert_tensor_size
    assert etp == 2
    tokens, _ = _ring_hidden(cfg)
    routed = tokens / layout.tensor * m.moe_router_topk * m.hidden_size * 4  # fp32
    (row,) = [t for t in stage.traffic if t.group == "expert-tp"]
    assert row.operation == EXPERT_TP
    times = 4 * m.num_layers * layout.microbatches
    assert row.collectives == times
    assert row.bytes_sent == pytest.approx(times * (etp - 1) / etp * etp * routed)
    _, none = _plan("parallel.expert_tensor=1")
    assert not [t for t in none.traffic if t.group == "expert-tp"]


def test_the_step_model_times_expert_tp_with_the_token_exchange():
    cfg, stage = _plan("parallel.expert_tensor=null")
    assert not cfg.parallel.ep_comm_overlap
    exchange = sum(t.seconds for t in stage.traffic if t.group in ("ep", "expert-tp"))
    assert any(t.group == "expert-tp" for t in stage.traffic)
    assert step_time(cfg, [stage], 1.0).ep == pytest.approx(exchange)


def test_the_plan_places_the_expert_tp_groups_it_sends_over():
    from recipes.plan.placement import group_summaries

    kinds = {etp: [g.kind for g in group_summaries(_plan(f"parallel.expert_tensor={etp}")[0]
                                                   .layout, moe=True)]
             for etp in ("null", "1")}
    assert "expert-tp" in kinds["null"] and "expert-tp" not in kinds["1"]

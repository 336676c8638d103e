"""Communication per optimizer step: bytes each rank sends per group type, and a time.

Ring collectives: an all-reduce over n ranks sends 2·(n-1)/n of the buffer from each rank, an
all-gather or reduce-scatter (n-1)/n, an all-to-all (n-1)/n of what is exchanged. Per layer
and micro-batch, TP does one all-reduce forward and one backward per sublayer (a GPT layer's
attention and MLP, each layer of a hybrid model; with sequence parallel: an all-gather and a
reduce-scatter in place of each, the same bytes); full recompute repeats the forward ones.
PP sends one activation forward and one gradient back per stage boundary and
micro-batch (per chunk when interleaved). DP reduces gradients once per step: all-reduce, or
reduce-scatter plus the weights' all-gather with a sharded optimizer (FP8 parameters gathered
in one byte each). CP passes K/V around its
ring (and dK/dV back) in attention layers and, in Mamba layers, turns the mixer's inputs from
sequence shards into head shards and its output back by all-to-all; EP exchanges routed tokens
four times per MoE layer. A group whose
ranks span nodes is timed at the inter-node bandwidth, else at the intra-node one; latency and
overlap with compute are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.models import kinds
from recipes.models.hybrid import pattern as hybrid
from recipes.plan.activations import _ACT_BYTES
from recipes.plan.params import ParamCount, stage_kinds


@dataclass(frozen=True)
class Traffic:
    group: str  # 'tp', 'pp', 'dp', 'cp', 'ep', 'expert-dp'
    operation: str
    bytes_sent: float  # per rank per optimizer step
    inter_node: bool
    seconds: float


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def crossing_kinds(layout: Any) -> dict[str, bool]:
    """Whether any group of each kind spans nodes (computed once per plan)."""
    return {kind: layout.any_group_crosses_nodes(kind)
            for kind in ("tp", "pp", "dp-cp", "cp", "ep", "expert-dp")}


def _tp(cfg: Any, d: int, tokens: float, sublayers: int) -> tuple[str, float]:
    layout, m = cfg.layout, cfg.model
    collectives = 2 + (1 if cfg.train.recompute == "full" else 0)
    buffer = tokens * m.hidden_size * d
    per = 2 * _ring(layout.tensor) * buffer
    name = "all-gather + reduce-scatter (SP)" if layout.sequence_parallel else "all-reduce"
    return name, collectives * per * sublayers * layout.microbatches


def _pp(cfg: Any, d: int, tokens: float, stage: int) -> float:
    layout = cfg.layout
    split = layout.tensor if layout.sequence_parallel else 1
    buffer = tokens * cfg.model.hidden_size * d / split
    sends = (stage < layout.pipeline - 1) + (stage > 0)
    if layout.virtual_stages > 1:
        sends = 2  # interleaved chunks pass through every rank in both directions
    return sends * buffer * layout.microbatches * layout.virtual_stages


def _dp(cfg: Any, params: int, ranks: int, sharded: bool,
        low: int = 0) -> tuple[str, float]:
    """`low` of the parameters are gathered in the bytes a plugin stores them in (FP8
    parameters: `gemm_weights.py`)."""
    p = cfg.precision
    grad = 4 if (p.grad_reduce_in_fp32 or p.dtype == "fp32") else 2
    weight = _ACT_BYTES[p.dtype]
    if sharded:
        stored = cfg.plugins.gemm_weights(cfg) if low else None
        gathered = params * weight - (low * (weight - stored.bytes_per_weight) if stored else 0)
        return "reduce-scatter + all-gather", (params * grad + gathered) * _ring(ranks)
    return "all-reduce", params * grad * 2 * _ring(ranks)


def _cp(cfg: Any, d: int, tokens: float, layers: int) -> float:
    layout, m = cfg.layout, cfg.model
    width = m.kv_channels or m.hidden_size // m.num_attention_heads
    kv = 2 * (m.num_query_groups or m.num_attention_heads) * width / layout.tensor
    forward = (layout.context - 1) * tokens * kv * d  # K/V chunk handed round the ring
    return 3 * forward * layers * layout.microbatches  # backward: K/V again plus dK/dV


def _mamba_cp(cfg: Any, d: int, tokens: float, layers: int) -> float:
    """Megatron's Mamba CP (`ssm/mamba_context_parallel.py:140-211`): before the conv and scan
    z, x, B, C and dt each go from this rank's sequence chunk to all of the sequence for
    1/CP of the TP rank's heads (B and C first repeated when the TP rank has fewer groups than
    CP ranks, l.119-125, 171-184), and after it y goes back; each all-to-all sends (n-1)/n of
    its input, its backward the gradient's. Full recompute repeats the forward ones."""
    layout, m = cfg.layout, cfg.model
    cp, tp = layout.context, layout.tensor
    heads, groups = hybrid.mamba_heads(m) / tp, m.mamba_num_groups / tp
    inner = heads * m.mamba_head_dim
    repeat = cp / groups if groups < cp else 1
    bc = 2 * groups * repeat * m.mamba_state_dim
    width = 2 * inner + bc + heads + inner  # z, x, B, C, dt in; y out
    collectives = 2 + (1 if cfg.train.recompute == "full" else 0)
    return collectives * _ring(cp) * tokens * width * d * layers * layout.microbatches


def _ep(cfg: Any, d: int, tokens: float, layers: int) -> float:
    """Dispatch and combine, forward and backward; selective recompute of the MoE layer
    (`train.recompute_modules` moe) dispatches and combines its forward again."""
    layout, m, t = cfg.layout, cfg.model, cfg.train
    routed = tokens * m.moe_router_topk * m.hidden_size * d / layout.tensor
    again = 2 if t.recompute == "selective" and "moe" in t.recompute_modules else 0
    return (4 + again) * _ring(layout.expert) * routed * layers * layout.microbatches


def _traffic(crossing: dict[str, bool], cluster: Any, kind: str, operation: str,
             sent: float) -> Traffic:
    inter = crossing[kind]
    bandwidth = cluster.inter_node_gb_per_s if inter else cluster.intra_node_gb_per_s
    return Traffic(kind, operation, sent, inter, sent / (bandwidth * 1e9))


def stage_traffic(cfg: Any, cluster: Any, crossing: dict[str, bool], stage: int,
                  count: ParamCount, sharded: bool,
                  counts: dict[str, int] | None = None,
                  low: ParamCount | None = None) -> list[Traffic]:
    """What one rank of `stage` sends in one optimizer step, per group type in use; `counts`
    (its layers by kind, the stage's entry of `params.stage_kinds`) may be handed in by a
    caller planning every stage, which works them out once; `low`: the stage's GEMM weights a
    plugin gathers in fewer bytes (FP8 parameters)."""
    low = low or ParamCount()
    layout = cfg.layout
    dense_ranks, expert_ranks = layout.data_parallel * layout.context, layout.expert_data_parallel
    d = _ACT_BYTES[cfg.precision.dtype]
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length / layout.context
    counts = counts if counts is not None else stage_kinds(cfg)[stage]
    found = []
    if layout.tensor > 1:
        name, sent = _tp(cfg, d, tokens, sum(counts.values()))
        found.append(_traffic(crossing, cluster, "tp", name, sent))
    if layout.pipeline > 1:
        found.append(_traffic(crossing, cluster, "pp", "send/recv",
                              _pp(cfg, d, tokens, stage)))
    if dense_ranks > 1:
        name, sent = _dp(cfg, count.dense, dense_ranks, sharded, low.dense)
        found.append(_traffic(crossing, cluster, "dp-cp", name, sent))
    if count.expert and expert_ranks > 1:
        name, sent = _dp(cfg, count.expert, expert_ranks, sharded, low.expert)
        found.append(_traffic(crossing, cluster, "expert-dp", name, sent))
    if layout.context > 1:
        found.append(_traffic(crossing, cluster, "cp", "K/V ring exchange",
                              _cp(cfg, d, tokens, counts[kinds.ATTENTION])))
        if counts.get(kinds.MAMBA):
            found.append(_traffic(crossing, cluster, "cp", "Mamba all-to-all",
                                  _mamba_cp(cfg, d, tokens, counts[kinds.MAMBA])))
    if layout.expert > 1 and cfg.model.num_moe_experts:
        found.append(_traffic(crossing, cluster, "ep", "all-to-all",
                              _ep(cfg, d, tokens, counts[kinds.MOE])))
    return found

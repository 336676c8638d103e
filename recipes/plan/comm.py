"""Communication per optimizer step: bytes each rank sends per group type, how many collectives
it starts, and a time.

Ring collectives: an all-reduce over n ranks sends 2·(n-1)/n of the buffer from each rank, an
all-gather or reduce-scatter (n-1)/n, an all-to-all (n-1)/n of what is exchanged. Per layer
and micro-batch, TP does one all-reduce forward and one backward per sublayer (a GPT layer's
attention and MLP, each layer of a hybrid model; with sequence parallel: an all-gather and a
reduce-scatter in place of each, the same bytes, and a column-parallel linear's backward
gathers its input again for the weight gradient). An MoE sublayer is one only through its
shared experts, a TP-split MLP: its routed experts split over expert TP, whose token
dispatcher gathers the routed tokens after the exchange and reduce-scatters them before the
combine (`_expert_tp`; none at expert TP 1). PP sends one activation forward and one
gradient back per stage boundary and micro-batch (per chunk when interleaved). DP reduces
gradients and, with a sharded optimizer, gathers weights (FP8 parameters gathered in one byte
each) as often as the sharding does (`dp_passes`: once a step, or per micro-batch under
Megatron FSDP). CP passes K/V around its ring (and dK/dV back) in attention layers and, in
Mamba layers, turns the mixer's inputs from sequence shards into head shards and its output
back by all-to-all; EP exchanges routed tokens four times per MoE layer the stage runs, at the
width the routed experts read (a latent MoE's latent width: Megatron projects tokens down
before the dispatch and back up after the combine); the allgather dispatcher instead gathers
every token of the expert-TP x EP group and reduce-scatters the output
(`_allgather_dispatch`). The last stage also runs a hybrid model's
MTP depths (`mtp_kinds`): their layers send what the decoder's layers of their kinds send (TP,
CP, EP), and each depth's input projection its own TP gathers (`_mtp_projection`). There the
output layer and its vocabulary-parallel loss run once per head (the main one and each MTP
depth's) and micro-batch, outside every recompute checkpoint (`_output_layers`). A forward
that is recomputed in the backward (`recomputed`) runs its collectives again: full recompute
every layer's (an MTP layer's twice, `mtp_recomputed`), selective recompute of `moe` the MoE
layer's token exchange and of `core_attn` the CP ring. Each figure is counted from the stage's
layers by kind (`params.stage_kinds`; for EP `moe_passes`), bytes and collectives together, so
the step model's latency term counts what the table shows. A TP row also names what of it a
column-parallel linear's backward launches asynchronously (`Hideable`), for the step model to
hide behind that linear's GEMMs. A group whose ranks span nodes is timed at the inter-node
bandwidth, else at the intra-node one; latency and overlap with compute are the step model's
(`recipes/plan/steptime.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.config.schema import uses_transformer_engine
from recipes.models import kinds
from recipes.models.hybrid import pattern as hybrid
from recipes.models.moe.params import expert_width
from recipes.plan.activations import _ACT_BYTES
from recipes.plan.params import ParamCount, stage_kinds


@dataclass(frozen=True)
class Hideable:
    """Of a TP row, what column-parallel linears' backward launches asynchronously
    (`LinearWithGradAccumulationAndAsyncCommunication.backward`, `tensor_parallel/layers.py`):
    the input's gradient all-reduced (`allreduce_dgrad`) or, with SP, reduce-scattered before the
    weight-gradient GEMM, and with SP the input re-gathered before the input-gradient GEMM, each
    collective running under one backward GEMM of `linear` (the step model's to time)."""

    linear: str  # a layer kind (its column-parallel linear), OUTPUT_LAYERS or MTP_PROJECTIONS
    bytes_sent: float
    seconds: float
    collectives: float


@dataclass(frozen=True)
class Traffic:
    group: str  # 'tp', 'pp', 'dp-cp', 'cp', 'ep', 'expert-tp', 'expert-dp'
    operation: str
    bytes_sent: float  # per rank per optimizer step
    inter_node: bool
    seconds: float
    collectives: float = 0.0  # collectives (ring steps, p2p sends) one rank starts per step
    passes: int = 1  # DP: times a step reduces (or gathers) the whole buffer
    weights: bool = False  # DP: the weights' all-gather (else the gradients' reduce)
    hideable: tuple[Hideable, ...] = ()  # TP: of the above, the column-parallel backward's


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def crossing_kinds(layout: Any) -> dict[str, bool]:
    """Whether any group of each kind spans nodes (computed once per plan)."""
    return {kind: layout.any_group_crosses_nodes(kind)
            for kind in ("tp", "pp", "dp-cp", "cp", "ep", "expert-tp", "expert-dp")}


def recomputed(cfg: Any, module: str | None = None) -> int:
    """1 when the backward runs a layer's forward again, with the collectives inside it: every
    layer's under full recompute; under selective recompute, `module`'s when
    `train.recompute_modules` names it (None: the whole layer, which selective recompute never
    reruns). Megatron reruns the forward as it ran (`tensor_parallel.checkpoint`), so a
    recomputed MoE layer dispatches and combines again and a recomputed attention layer passes
    its K/V round the CP ring again."""
    t = cfg.train
    if t.recompute == "full":
        return 1
    return int(t.recompute == "selective" and module is not None
               and module in t.recompute_modules)


def mtp_recomputed(cfg: Any, module: str | None = None) -> int:
    """Forwards of an MTP depth's layer that the backward runs again: under full recompute two,
    for the depth runs whole inside one checkpoint (`MultiTokenPredictionLayer.
    _checkpointed_forward`) whose rerun checkpoints each of its layers again (its HybridStack
    under the same settings, `recompute.checkpointed_forward`), so the layer's own backward
    reruns it once more; otherwise what a decoder layer reruns (`recomputed`: selective
    recompute checkpoints the same modules in the same layer classes)."""
    return 2 if cfg.train.recompute == "full" else recomputed(cfg, module)


def mtp_kinds(cfg: Any, stage: int) -> dict[str, int]:
    """Layers of each kind a hybrid model's MTP block runs on `stage` per micro-batch's forward:
    on the last stage every depth's (`hybrid.mtp_count`, as the FLOPs count them; the block is
    built there, `models/hybrid/hybrid_model.py:217-229`, and runs each depth in turn, the
    one shared layer again at every depth under `model.mtp_use_repeated_layer`), elsewhere
    none."""
    m = cfg.model
    if not m.is_hybrid or stage != cfg.layout.pipeline - 1:
        return {}
    found = {symbol: hybrid.mtp_count(m, symbol) for symbol in kinds.LAYER_SYMBOLS}
    return {symbol: n for symbol, n in found.items() if n}


def mtp_depths_on(cfg: Any, stage: int) -> int:
    """MTP depths `stage` runs: all of them on the last stage of a hybrid model, else none."""
    m = cfg.model
    last = stage == cfg.layout.pipeline - 1
    return hybrid.mtp_depths(m.hybrid_layer_pattern) if m.is_hybrid and last else 0


def layer_passes(cfg: Any, decoder: int, mtp: int, once: int,
                 module: str | None = None) -> int:
    """Times a per-layer collective runs in one micro-batch over `decoder` decoder layers and
    `mtp` MTP layers: `once` per layer without recompute (forward and backward), plus each
    forward that recompute reruns (`recomputed`, `mtp_recomputed`; `module`: what selective
    recompute names the collective's module by)."""
    return (decoder * (once + recomputed(cfg, module))
            + mtp * (once + mtp_recomputed(cfg, module)))


def tp_kinds(m: Any) -> tuple[str, ...]:
    """Layer kinds with a TP sublayer, each opening with a column-parallel linear (QKV, FC1, a
    Mamba layer's in_proj, the shared experts' FC1): all but an MoE layer without shared
    experts, whose tokens reach its routed experts split over TP (sequence parallel, which
    Megatron's `MoELayer` requires with TP) and leave the same way; its expert-TP collectives
    are the token dispatcher's (`_expert_tp`)."""
    moe = (kinds.MOE,) if m.moe_shared_expert_ffn_hidden_size else ()
    return (kinds.ATTENTION, kinds.MLP, kinds.MAMBA, *moe)


Hidden = tuple[tuple[str, float, float], ...]  # (linear, bytes, collectives) of `Hideable`s


def _tp(cfg: Any, d: int, tokens: float, passes: int,
        backward: dict[str, int]) -> tuple[str, float, float, Hidden]:
    """(operation, bytes, collectives, hideable): per sublayer and micro-batch an all-reduce
    forward and one backward (with SP an all-gather and a reduce-scatter each), again when
    recomputed (`passes`: `layer_passes` over the stage's sublayers, its MTP layers' included).
    The forward's are the row-parallel linear's output reduce (and with SP the column-parallel
    one's input gather); the backward's reduce is the column-parallel linear's input gradient
    (`backward`: the stage's layers by `tp_kinds`), its gather with SP the row-parallel
    one's output gradient (`_ReduceScatterToSequenceParallelRegion.backward`, synchronous). With
    SP the column-parallel backward also gathers its input again for the weight gradient
    (`LinearWithGradAccumulationAndAsyncCommunication.backward`), once per backward, however
    often the forward reruns: a further ring x tokens x hidden per column sublayer and
    micro-batch. The column backward's collectives are the hideable part."""
    layout, m = cfg.layout, cfg.model
    buffer = tokens * m.hidden_size * d
    per = 2 * _ring(layout.tensor) * buffer
    sp = layout.sequence_parallel
    name = "all-gather + reduce-scatter (SP)" if sp else "all-reduce"
    times, micro = passes * layout.microbatches, layout.microbatches
    launched = 2 if sp else 1  # collectives a pass starts
    regathers = sum(backward.values()) * micro if sp else 0  # once a column backward
    # A column backward's hideable part: its input's gradient all-reduced, or (SP) reduce-
    # scattered and its input re-gathered: the same bytes (`per`), one or two collectives.
    hidden = tuple((kind, n * micro * per, n * micro * launched)
                   for kind, n in backward.items() if n)
    return name, times * per + regathers * per / 2, times * launched + regathers, hidden


MTP_PROJECTIONS = "MTP input projections"  # the TP row `_mtp_projection` fills
EXPERT_TP = "all-gather + reduce-scatter"  # the expert-TP row `_expert_tp` fills
ALLGATHER_DISPATCH = "token all-gather + reduce-scatter"  # `_allgather_dispatch`'s EP row


def _mtp_projection(cfg: Any, d: int, tokens: float,
                    depths: int) -> tuple[float, float, Hidden]:
    """(bytes, collectives, hideable) of the MTP depths' input projections (`eh_proj`, a
    column-parallel linear from [embedding; hidden], 2·hidden wide, to hidden, whose output is
    gathered whole and, under SP, split over the sequence again: `MultiTokenPredictionLayer.
    _concat_embeddings`). With SP, forward: the 2·hidden-wide input all-gathered over the
    sequence and the output all-gathered over its hidden shards; backward: the input's gradient
    reduce-scattered and the output's all-gathered (the sequence split's backward). Without SP,
    forward: the output's all-gather; backward: the input's gradient all-reduced (2·hidden
    wide). Full recompute reruns the forward once (the depth's checkpoint holds the projection;
    the inner, per-layer ones do not). The column-parallel backward's input gradient and, with
    SP, its 2·hidden-wide input gathered again for the weight gradient, once per backward, are
    the hideable part."""
    layout = cfg.layout
    buffer = tokens * cfg.model.hidden_size * d
    ring = _ring(layout.tensor)
    forwards = 1 + recomputed(cfg)
    sp = layout.sequence_parallel
    # The column backward's: with SP the input's gradient reduce-scattered and the input
    # re-gathered (2·hidden wide each), without it the gradient all-reduced; the same bytes.
    column, launched = 2 * ring * 2 * buffer, 2 if sp else 1
    if sp:  # each forward: 2·hidden and hidden wide, two collectives; the backward's output
        sent, started = forwards * 3 * ring * buffer + ring * buffer, forwards * 2 + 1
    else:
        sent, started = forwards * ring * buffer, forwards
    times = depths * layout.microbatches
    return (times * (sent + column), times * (started + launched),
            ((MTP_PROJECTIONS, times * column, times * launched),))


OUTPUT_LAYERS = "output layers and losses"  # the TP row `_output_layers` fills


def _output_layers(cfg: Any, d: int, tokens: float, depths: int,
                   fused: bool) -> tuple[float, float, Hidden]:
    """(bytes, collectives, hideable) of the last stage's output layer and loss, once for the
    main head and once for each of `depths` MTP depths per micro-batch (`process_mtp_loss`,
    `transformer/multi_token_prediction.py:840-855`); no checkpoint holds them, so recompute
    reruns none.

    The output layer is Megatron's `ColumnParallelLinear`
    (`tensor_parallel/layers.py:525-700`, `LinearWithGradAccumulationAndAsyncCommunication`).
    With SP it all-gathers its input (tokens x hidden) over the sequence in the forward, and in
    the backward all-gathers it again for the weight gradient and reduce-scatters the input's
    gradient: three collectives of the hidden states. Without SP the backward all-reduces the
    input's gradient. The backward's launch asynchronously (hideable). The vocabulary-parallel
    cross entropy all-reduces each token's maximum, target logit and sum of exponentials in FP32
    (`tensor_parallel/cross_entropy.py:130-152`: three all-reduces; the fused one, which TE
    ranks run, two, the last two batched in one, `fusions/fused_cross_entropy.py:94, 112-114`).
    Each MTP depth also gathers its logits' per-token maximum (the dtype) and its index (int64)
    from every TP rank for its acceptance count (`_vocab_parallel_argmax`, :493-511)."""
    layout = cfg.layout
    ring, micro = _ring(layout.tensor), layout.microbatches
    hidden = tokens * cfg.model.hidden_size * d
    sp = layout.sequence_parallel
    backward, asynchronous = 2 * ring * hidden, 2 if sp else 1  # same bytes either way
    sent = backward + (ring * hidden if sp else 0.0)
    started = asynchronous + (1 if sp else 0)
    sent += 2 * ring * 3 * tokens * 4  # the loss's three FP32 values a token, all-reduced
    started += 2 if fused else 3
    argmax = (layout.tensor - 1) * tokens * (d + 8)  # each rank's maximum and its index
    heads = 1 + depths
    return (micro * (heads * sent + depths * argmax), micro * (heads * started + depths * 2),
            ((OUTPUT_LAYERS, micro * heads * backward, micro * heads * asynchronous),))


def _pp(cfg: Any, d: int, tokens: float, stage: int) -> tuple[float, float]:
    """(bytes, collectives): the stage's sends; the collectives count its sends and receives
    as two per micro-batch and chunk each way (what the step model has always priced)."""
    layout = cfg.layout
    split = layout.tensor if layout.sequence_parallel else 1
    buffer = tokens * cfg.model.hidden_size * d / split
    sends = (stage < layout.pipeline - 1) + (stage > 0)
    if layout.virtual_stages > 1:
        sends = 2  # interleaved chunks pass through every rank in both directions
    chunks = layout.microbatches * layout.virtual_stages
    return sends * buffer * chunks, 2 * 2 * chunks


def traffic_sharding(sharding: str) -> str:
    """What of a sharding (`memory.SHARDINGS`) DP traffic depends on: the distributed optimizer
    and Megatron FSDP's `optim` reduce and gather once a step alike (`dp_passes`), so a figure
    memoised for one serves the other."""
    return "dist_opt" if sharding == "optim" else sharding


def dp_passes(sharding: str, microbatches: int) -> tuple[int, int]:
    """(gradient reduces, weight gathers) of the whole buffer per step.

    DDP all-reduces once, the distributed optimizer (and Megatron FSDP's `optim`) reduce-
    scatters once and gathers the updated weights once. Megatron FSDP cannot keep whole
    gradients between micro-batches once they are sharded: read in Megatron Core 0.19.2,
    `distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py`, `MegatronFSDP._register_fsdp_hooks`:
    `_process_post_backward_gradients` and `_root_post_backward` reduce-scatter on every
    backward when `grad_reduce_every_bprop` (strategy `optim_grads` or `optim_grads_params`),
    whatever `no_sync` / `is_last_microbatch` say (those gate only `optim` and `no_shard`). With
    weights sharded too (`optim_grads_params`) `_pre_forward_param_unshard` gathers a layer's
    weights before its forward and `_pre_backward_param_unshard` before its backward, and
    `_post_forward` / `_post_backward_release_module` free them after each: two gathers per
    micro-batch (a full recompute's forward reruns inside the backward and keeps its gather for
    it, `_post_forward` with `lazy_release`, so it adds none). The first forward's gather is the
    one the other shardings do after the optimizer step."""
    if sharding == "none":
        return 1, 0
    reduces = microbatches if sharding in ("optim_grads", "optim_grads_params") else 1
    gathers = 2 * microbatches if sharding == "optim_grads_params" else 1
    return reduces, gathers


def _dp(cfg: Any, params: int, ranks: int, sharding: str,
        low: int = 0) -> list[tuple[str, float, int, bool]]:
    """(operation, bytes, passes, weights) of each DP collective per step: the gradients'
    reduce, and with sharding the weights' gather, each `dp_passes` times. `low` of the
    parameters are gathered in the bytes a plugin stores them in (FP8 parameters:
    `gemm_weights.py`)."""
    p = cfg.precision
    grad = 4 if (p.grad_reduce_in_fp32 or p.dtype == "fp32") else 2
    reduces, gathers = dp_passes(sharding, cfg.layout.microbatches)
    if sharding == "none":
        return [("all-reduce", params * grad * 2 * _ring(ranks), reduces, False)]
    weight = _ACT_BYTES[p.dtype]
    stored = cfg.plugins.gemm_weights(cfg) if low else None
    gathered = params * weight - (low * (weight - stored.bytes_per_weight) if stored else 0)
    return [(_times("reduce-scatter", reduces), reduces * params * grad * _ring(ranks),
             reduces, False),
            (_times("all-gather", gathers), gathers * gathered * _ring(ranks), gathers, True)]


def _times(operation: str, passes: int) -> str:
    return operation if passes == 1 else f"{operation}, {passes} a step"


def _cp(cfg: Any, d: int, tokens: float, passes: int) -> tuple[float, float]:
    """(bytes, collectives): each of the CP - 1 ring steps hands a K/V chunk on; the backward
    hands K/V on again plus dK/dV (three passes), a recomputed attention core a fourth (full
    recompute, or selective `core_attn`: `Attention._checkpointed_attention_forward` reruns the
    core, its ring included). `passes`: `layer_passes` over the stage's attention layers."""
    layout, m = cfg.layout, cfg.model
    width = m.kv_channels or m.hidden_size // m.num_attention_heads
    kv = 2 * (m.num_query_groups or m.num_attention_heads) * width / layout.tensor
    forward = (layout.context - 1) * tokens * kv * d  # K/V chunk handed round the ring
    times = passes * layout.microbatches
    return times * forward, times * (layout.context - 1)


MAMBA_CP_ALL_TO_ALLS = 6  # z, x, B, C, dt in and y out (mamba_context_parallel.py:140-211)
KV_RING = "K/V ring exchange"  # the CP traffic the attention core overlaps


def _mamba_cp(cfg: Any, d: int, tokens: float, passes: int) -> tuple[float, float]:
    """Megatron's Mamba CP (`ssm/mamba_context_parallel.py:140-211`): before the conv and scan
    z, x, B, C and dt each go from this rank's sequence chunk to all of the sequence for
    1/CP of the TP rank's heads (B and C first repeated when the TP rank has fewer groups than
    CP ranks, l.119-125, 171-184), and after it y goes back; each all-to-all sends (n-1)/n of
    its input, its backward the gradient's. Full recompute repeats the forward ones (`passes`:
    `layer_passes` over the stage's Mamba layers). (bytes, collectives)."""
    layout, m = cfg.layout, cfg.model
    cp, tp = layout.context, layout.tensor
    heads, groups = hybrid.mamba_heads(m) / tp, m.mamba_num_groups / tp
    inner = heads * m.mamba_head_dim
    repeat = cp / groups if groups < cp else 1
    bc = 2 * groups * repeat * m.mamba_state_dim
    width = 2 * inner + bc + heads + inner  # z, x, B, C, dt in; y out
    times = passes * layout.microbatches
    return times * _ring(cp) * tokens * width * d, times * MAMBA_CP_ALL_TO_ALLS


def moe_passes(cfg: Any, stage: int, counts: dict[str, int]) -> int:
    """MoE layers one micro-batch's forward runs on `stage` (`counts`: its decoder layers by
    kind), each dispatching and combining: the decoder's, and on the last stage every MTP
    depth's (`mtp_kinds`)."""
    return counts.get(kinds.MOE, 0) + mtp_kinds(cfg, stage).get(kinds.MOE, 0)


def _routed(cfg: Any, d: int, tokens: float) -> float:
    """Bytes of the top-k routed copies of one rank's tokens (tokens / TP under sequence
    parallel) at the width the routed experts read."""
    m = cfg.model
    return tokens * m.moe_router_topk * expert_width(m) * d / cfg.layout.tensor


def _expert_tp(cfg: Any, d: int, tokens: float, passes: int) -> tuple[float, float]:
    """The token dispatcher's expert-TP collectives (`MoEAlltoAllTokenDispatcher`, over
    `expt_tp`): after the exchange each rank gathers the routed tokens its expert-TP peers
    received (`token_dispatch`), and reduce-scatters the experts' output before the combine
    (`token_combine`); the backward mirrors both; again when the MoE layer's forward is
    recomputed (`passes` as `_ep`'s). Each rank holds its own tokens / TP (sequence parallel),
    top-k copies each at the experts' width after the exchange, so a collective moves an
    expert-TP times larger buffer. (bytes, collectives)"""
    layout = cfg.layout
    etp = layout.expert_tensor_size
    times = 2 * passes * layout.microbatches
    return times * _ring(etp) * etp * _routed(cfg, d, tokens), times


def _ep(cfg: Any, d: int, tokens: float, passes: int) -> tuple[float, float]:
    """Dispatch and combine, forward and backward, and again when the MoE layer's forward is
    recomputed (full recompute, or selective recompute of `moe`; `passes`: `layer_passes` over
    the stage's MoE layers, counting a dispatch and its combine once). Each token goes to top-k
    experts at the width they read: a latent MoE projects its tokens down before the dispatch
    and combines at the latent width (`transformer/moe/moe_layer.py`: `preprocess`,
    `postprocess`), so its exchange is latent / hidden of the model-wide one.
    (bytes, collectives)."""
    layout = cfg.layout
    times = 2 * passes * layout.microbatches
    return times * _ring(layout.expert) * _routed(cfg, d, tokens), times


def _allgather_dispatch(cfg: Any, d: int, tokens: float, passes: int,
                        layers: int) -> tuple[float, float]:
    """The allgather token dispatcher (`MoEAllGatherTokenDispatcher`): no exchange of routed
    copies, but every rank gathers all tokens of its expert-TP x EP group and picks its
    experts' ones (`token_dispatch`: the routing map, the probabilities, then the hidden
    states at the experts' width), and reduce-scatters the experts' output over the same group
    in the probabilities' dtype (`token_combine`). The backward reduce-scatters the gathered
    hidden states' and probabilities' gradients and gathers the combine's; the map (a bool per
    expert) has none. `passes` as `_ep`'s, `layers` the MoE layers it runs over: the forwards
    are `passes - layers`. Probabilities are in the router's dtype (fp32 with
    `moe_router_fp32`, `router.py:103-108`, kept by `moe_utils.py:875`). (bytes, collectives)"""
    m, layout = cfg.model, cfg.layout
    group = layout.expert_tensor_size * layout.expert
    p = 4 if m.moe_router_fp32 else d
    local = tokens / layout.tensor * (group - 1)  # tokens the other ranks' shards hold
    width, experts = expert_width(m), m.num_moe_experts
    per_pass = local * (width * d + experts * p + width * p)  # hidden, probabilities, combine
    forwards = passes - layers
    sent = layout.microbatches * (passes * per_pass + forwards * local * experts)
    return sent, layout.microbatches * (3 * passes + forwards)


def _traffic(crossing: dict[str, bool], cluster: Any, kind: str, operation: str,
             sent: float, collectives: float, hidden: Hidden = (), passes: int = 1,
             weights: bool = False) -> Traffic:
    inter = crossing[kind]
    bandwidth = (cluster.inter_node_gb_per_s if inter else cluster.intra_node_gb_per_s) * 1e9
    hideable = tuple(Hideable(linear, part, part / bandwidth, started)
                     for linear, part, started in hidden)
    return Traffic(kind, operation, sent, inter, sent / bandwidth, collectives, passes, weights,
                   hideable)


def stage_traffic(cfg: Any, cluster: Any, crossing: dict[str, bool], stage: int,
                  count: ParamCount, sharding: str,
                  counts: dict[str, int] | None = None,
                  low: ParamCount | None = None) -> list[Traffic]:
    """What one rank of `stage` sends in one optimizer step, per group type in use.
    `sharding`: how DP shards the model state (`memory.SHARDINGS`; `memory.sharding_of` gives a
    run's own, or the planner's `sharding=`); `counts` (its layers by kind, the stage's entry of
    `params.stage_kinds`) may be handed in by a caller planning every stage, which works them
    out once; `low`: the stage's GEMM weights a plugin gathers in fewer bytes (FP8 parameters)."""
    low = low or ParamCount()
    layout = cfg.layout
    dense_ranks, expert_ranks = layout.data_parallel * layout.context, layout.expert_data_parallel
    d = _ACT_BYTES[cfg.precision.dtype]
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length / layout.context
    counts = counts if counts is not None else stage_kinds(cfg)[stage]
    chunks = layout.virtual_stages  # each model chunk reduces (and gathers) its own buffer
    mtp, depths = mtp_kinds(cfg, stage), mtp_depths_on(cfg, stage)

    def passes(of: tuple[str, ...], once: int, module: str | None = None) -> int:
        """`layer_passes` over the stage's layers of the kinds `of`."""
        decoder = sum(counts.get(kind, 0) for kind in of)
        extra = sum(mtp.get(kind, 0) for kind in of)
        return layer_passes(cfg, decoder, extra, once, module)

    found = []
    if layout.tensor > 1:
        sublayers = tp_kinds(cfg.model)
        column = {kind: counts.get(kind, 0) + mtp.get(kind, 0) for kind in sublayers}
        found.append(_traffic(crossing, cluster, "tp",
                              *_tp(cfg, d, tokens, passes(sublayers, 2), column)))
        if depths:
            found.append(_traffic(crossing, cluster, "tp", MTP_PROJECTIONS,
                                  *_mtp_projection(cfg, d, tokens, depths)))
        if stage == layout.pipeline - 1:
            fused = uses_transformer_engine(cfg.model.transformer_impl,
                                            on_gpu=cluster.device != "cpu")
            found.append(_traffic(crossing, cluster, "tp", OUTPUT_LAYERS,
                                  *_output_layers(cfg, d, tokens, depths, fused)))
    if layout.pipeline > 1:
        found.append(_traffic(crossing, cluster, "pp", "send/recv",
                              *_pp(cfg, d, tokens, stage)))
    for group, params, ranks, fewer in (("dp-cp", count.dense, dense_ranks, low.dense),
                                        ("expert-dp", count.expert, expert_ranks, low.expert)):
        if params and ranks > 1:
            for name, sent, dp, weights in _dp(cfg, params, ranks, sharding, fewer):
                found.append(_traffic(crossing, cluster, group, name, sent, dp * chunks,
                                      passes=dp, weights=weights))
    if layout.context > 1:
        found.append(_traffic(crossing, cluster, "cp", KV_RING,
                              *_cp(cfg, d, tokens, passes((kinds.ATTENTION,), 3, "core_attn"))))
        if counts.get(kinds.MAMBA) or mtp.get(kinds.MAMBA):
            found.append(_traffic(crossing, cluster, "cp", "Mamba all-to-all",
                                  *_mamba_cp(cfg, d, tokens, passes((kinds.MAMBA,), 2))))
    moe = passes((kinds.MOE,), 2, "moe")
    if cfg.model.moe_token_dispatcher == "allgather":
        if moe and layout.expert_tensor_size * layout.expert > 1:
            spans = {"ep": crossing["ep"] or crossing["expert-tp"]}  # the expert-TP x EP group
            found.append(_traffic(spans, cluster, "ep", ALLGATHER_DISPATCH, *_allgather_dispatch(
                cfg, d, tokens, moe, moe_passes(cfg, stage, counts))))
        return found
    if layout.expert_tensor_size > 1 and moe:
        found.append(_traffic(crossing, cluster, "expert-tp", EXPERT_TP,
                              *_expert_tp(cfg, d, tokens, moe)))
    if layout.expert > 1 and cfg.model.num_moe_experts:
        found.append(_traffic(crossing, cluster, "ep", "all-to-all", *_ep(cfg, d, tokens, moe)))
    return found

"""A modeled optimizer-step time for one layout: what the layout search ranks by.

Compute is the one FLOPs definition (`recipes/plan/flops.py`) split into the matrix
multiplies one rank runs, each timed at an efficiency that depends on its shape: a GEMM of
[m, k] x [k, n] reaches `peak_fraction` x m/(m+h) x k/(k+h) x n/(n+h) of the GPU's peak, where
h (`half_dim`) is the size at which a dimension halves the throughput. So TP that cuts the
widths, CP that cuts the tokens, and small micro-batches all pay for thin GEMMs. The products
are each layer kind's (a Mamba2 layer's projections and scan; a latent MoE's routed experts at
the latent width, its two projections and the shared experts at the model width) and add up to
the definition's FLOPs, each stage timed by the layer kinds it holds (a hybrid's stages may
hold different ones); a hybrid model's MTP depths (their layers, projections and logits) run
on the last stage, after the decoder, so they lengthen that stage alone. The backward is twice
the forward; full recompute adds one forward of every layer (two of an MTP layer), selective
recompute one forward of the modules it names.

Communication is the planner's own (`recipes/plan/comm.py`: bytes per group at the cluster's
bandwidths), with what overlaps taken out: TP and EP collectives sit between the GEMMs that
need them (exposed), but for a column-parallel linear's backward (QKV, FC1, in_proj, the
shared experts' FC1, the output layer, an MTP depth's projection), which launches its
input-gradient reduce and, with SP, its input's re-gather asynchronously, each hidden (its
latency too) behind one of the linear's backward GEMMs and exposed beyond it
(`column_hidden`; not under Megatron FSDP, whose runs lack the one-queue ordering it relies
on); the CP ring overlaps the attention core it feeds (exposed
beyond it), while a Mamba layer's CP all-to-alls are exposed (synchronous: `MambaContextParallel`'s
`pre_conv_ssm` and `post_conv_ssm` wait on each around the conv and scan);
pipeline sends overlap compute except along the fill and drain; the DP gradient reduce
overlaps the last micro-batch's backward (`optimizer.overlap_grad_reduce`; under Megatron FSDP
each micro-batch's reduce-scatter its own) and the distributed optimizer's all-gather the first
one's forward (`overlap_param_gather`; ZeRO-3's other gathers the step's compute). TP
communication overlap (`parallel.tp_comm_overlap`, Transformer Engine's userbuffers) hides TP's
collectives behind the layer's GEMMs they are split with (exposed only beyond them; in place of
the column-parallel backward's overlap, which it covers), and EP
overlap (`parallel.ep_comm_overlap`) the token exchange (with its expert-TP gathers, timed as
EP) behind the other micro-batch's layer.
Selective recompute repeats the forward of its modules (the attention core, a dense MLP's or an
MoE layer's GEMMs; norms and activations cost no GEMM). The bubble is (PP - 1) / VPP of the
slowest stage's per-micro-batch time. Each collective also
costs the cluster file's per-message latency (`collective_latency_us`, measured by
`plan.py calibrate=true`; none when the file has none), counted per step by `collective_counts`
(the traffic's own counts) and added, exposed, to its group's figure (the DP reduces' and
gathers' to what overlaps); and each kernel a
layer runs costs the file's `kernel_overhead_us` beyond its FLOPs (in compute): small layers
cut into many micro-batches pay for their many small kernels.

All of that assumes each rank has a device of its own. CPU ranks share their node's cores
(`host_cores` in a `device: cpu` cluster file): with more ranks than cores the node cannot
finish a step faster than all its ranks' compute spread over its cores, plus the exposed
communication every rank waits on together (`host_cores_bound`). The step is the larger of
that and the per-rank model, so a pipeline stage idling in its bubble lends its core to the
others, and TP ranks that all compute at once share the cores (the `cores` term, the excess).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from recipes.models import kinds
from recipes.models.gpt.flops import (
    attention_score_flops,
    logits_flops,
    mlp_flops,
    output_projection_flops,
    qkv_projection_flops,
)
from recipes.models.hybrid import pattern as hybrid
from recipes.models.hybrid.flops import mamba_flops, mtp_projection_flops
from recipes.models.moe.flops import moe_flops
from recipes.plan.comm import (
    KV_RING,
    MTP_PROJECTIONS,
    OUTPUT_LAYERS,
    mtp_recomputed,
    recomputed,
)
from recipes.plan.flops import FlopsShape
from recipes.plan.params import stage_kinds

# Kernels one layer's forward runs in Megatron's layers (norms, QKV, RoPE, the attention
# core's products, mask and softmax, projection, bias-dropout-adds, the MLP's two products and
# activation); the backward runs about twice as many.
KERNELS_PER_LAYER = 24


def layer_kernels(recompute: str) -> int:
    """Kernels one layer runs for one micro-batch: its forward, the backward's two passes'
    worth, and the forward again under full recompute (what `kernel_overhead_us` multiplies,
    and what `calibrate=true` divides a measured layer's time by)."""
    return KERNELS_PER_LAYER * (3 + (1 if recompute == "full" else 0))


PEAK_FRACTION = 0.75  # share of peak a large GEMM reaches (cluster file: gemm_peak_fraction)
HALF_DIM = 64.0  # GEMM dimension at which throughput halves (cluster file: gemm_half_dim)


@dataclass(frozen=True)
class Gemm:
    """Forward FLOPs of one product on one rank and its shape [m, k] x [k, n]."""

    flops: float
    m: float
    k: float
    n: float
    module: str = ""  # the `train.recompute_modules` entry that reruns it ('mlp', 'moe')
    column: float = 0.0  # share of its FLOPs a column-parallel linear's (QKV, FC1, in_proj)


def gemm_efficiency(g: Gemm, peak_fraction: float, half_dim: float) -> float:
    share = 1.0
    for dim in (g.m, g.k, g.n):
        share *= dim / (dim + half_dim)
    return peak_fraction * share


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step, by cause (the search's breakdown)."""

    compute: float  # micro-batches x the slowest stage's compute (recompute included)
    bubble: float
    tp: float
    cp: float
    ep: float
    pp: float
    dp: float
    cores: float = 0.0  # what the host-cores bound adds beyond the per-rank model (CPU ranks)

    @property
    def total(self) -> float:
        return (self.compute + self.bubble + self.tp + self.cp + self.ep + self.pp + self.dp
                + self.cores)

    def items(self) -> dict[str, float]:
        return {"compute": self.compute, "bubble": self.bubble, "tp": self.tp, "cp": self.cp,
                "ep": self.ep, "pp": self.pp, "dp": self.dp, "cores": self.cores}


def _shape(cfg: Any, counts: dict[str, int], depths: int) -> FlopsShape:
    """The model's FLOPs shape (`FlopsShape.from_config`) with only the layers `counts` names
    by kind and `depths` MTP depths."""
    return dataclasses.replace(
        FlopsShape.from_config(cfg), attention_layers=counts.get(kinds.ATTENTION, 0),
        dense_mlp_layers=counts.get(kinds.MLP, 0), moe_layers=counts.get(kinds.MOE, 0),
        mamba_layers=counts.get(kinds.MAMBA, 0), mtp_depths=depths)


def decoder_shape(cfg: Any) -> FlopsShape:
    """The FLOPs shape of the decoder's layers alone, which the pipeline stages share out: a
    hybrid model's MTP depths run on the last stage (`mtp_shape`)."""
    s, m = FlopsShape.from_config(cfg), cfg.model
    if not s.mtp_depths:
        return s
    return _shape(cfg, {symbol: hybrid.count(m, symbol) for symbol in kinds.LAYER_SYMBOLS}, 0)


def mtp_shape(cfg: Any) -> FlopsShape | None:
    """The FLOPs shape of a hybrid model's MTP block (every depth's layers by kind, as
    `FlopsShape.from_config` adds them to the decoder's); None without MTP depths."""
    s, m = FlopsShape.from_config(cfg), cfg.model
    if not s.mtp_depths:
        return None
    return _shape(cfg, {symbol: hybrid.mtp_count(m, symbol) for symbol in kinds.LAYER_SYMBOLS},
                  s.mtp_depths)


def _moe_gemms(cfg: Any, s: FlopsShape, share: float, tokens: float) -> list[Gemm]:
    """An MoE layer's products on one rank, `share` of them, its FLOPs `moe_flops` per token:
    the routed experts at the width they read (a latent MoE's latent width: fc1 latent ->
    expert width, fc2 back), each local expert fed the copies routed to it from its EP x
    expert-TP group (tokens / TP each, as SP splits them, x top-k x EP x expert-TP / experts);
    the latent projections (hidden -> latent -> hidden, whole on every TP rank, each over its
    own tokens / TP); the shared experts, a dense MLP split over TP. The routed experts' FLOPs
    are what `moe_flops` leaves after the other two, so the three add up to it."""
    layout, tp, m = cfg.layout, cfg.layout.tensor, cfg.model
    gate = 2 if s.gated else 1
    total = share * tokens * moe_flops(s) / tp
    gemms = []
    if s.moe_shared_ffn_hidden_size:
        width = s.moe_shared_ffn_hidden_size
        gemms.append(Gemm(share * tokens * mlp_flops(s, width) / tp, tokens, s.hidden_size,
                          width / tp * (gate + 1) / 2, "moe",
                          gate / (gate + 1)))  # FC1, column-parallel, as a dense MLP's
    if s.moe_latent_size:
        own = tokens / tp
        gemms.append(Gemm(share * own * 2 * 2 * s.hidden_size * s.moe_latent_size, own,
                          s.hidden_size, s.moe_latent_size, "moe"))
    width = s.moe_latent_size or s.hidden_size
    routed = max(1.0, tokens / tp * s.moe_router_topk * layout.expert
                 * layout.expert_tensor_size / m.num_moe_experts)
    gemms.append(Gemm(total - sum(g.flops for g in gemms), routed, width,
                      s.moe_ffn_hidden_size / layout.expert_tensor_size * (gate + 1) / 2, "moe"))
    return gemms


def _mamba_gemms(s: FlopsShape, share: float, tokens: float, tp: int) -> list[Gemm]:
    """A Mamba2 layer's products on one rank, `share` of them, its FLOPs `mamba_flops` per
    token: in_proj (hidden -> z, x, B, C, dt, split over TP), out_proj (d_inner / TP ->
    hidden), and the chunked scan's small products, whose sizes are the chunk, the state and a
    head's width (what `mamba_flops` leaves after the two projections)."""
    h, inner = s.hidden_size, s.mamba_inner
    width = 2 * inner + 2 * s.mamba_groups * s.mamba_state + s.mamba_heads
    in_proj = Gemm(share * tokens * 2 * h * width / tp, tokens, h, width / tp, column=1.0)
    out_proj = Gemm(share * tokens * 2 * inner * h / tp, tokens, inner / tp, h)
    scan = share * tokens * mamba_flops(s) / tp - in_proj.flops - out_proj.flops
    return [in_proj, out_proj,
            Gemm(scan, s.mamba_chunk, s.mamba_state, inner / s.mamba_heads)]


def _kind_gemms(cfg: Any, s: FlopsShape, per: int) -> tuple[list[Gemm], Gemm]:
    """The products one rank runs for one micro-batch in the layers `s` counts by kind, over
    `per` of them (the decoder's mean layer; 1: all of them), and the attention cores apart."""
    m, layout = cfg.model, cfg.layout
    tp, cp = layout.tensor, layout.context
    tokens = layout.micro_batch * m.seq_length / cp
    h, query = s.hidden_size, s.num_attention_heads * s.kv_channels
    kv = s.num_query_groups * s.kv_channels
    share = s.attention_layers / per
    gemms = [Gemm(share * tokens * qkv_projection_flops(s) / tp, tokens, h, (query + 2 * kv) / tp,
                  column=1.0),
             Gemm(share * tokens * output_projection_flops(s) / tp, tokens, query / tp, h)]
    gate = 2 if s.gated else 1
    if s.mamba_layers:
        gemms += _mamba_gemms(s, s.mamba_layers / per, tokens, tp)
    if s.dense_mlp_layers:
        ffn = s.ffn_hidden_size / tp
        gemms.append(Gemm(s.dense_mlp_layers / per * tokens * mlp_flops(s, s.ffn_hidden_size)
                          / tp, tokens, h, ffn * (gate + 1) / 2, "mlp",
                          gate / (gate + 1)))  # FC1: gate x ffn of the (gate + 1) x ffn
    if s.moe_layers:
        gemms += _moe_gemms(cfg, s, s.moe_layers / per, tokens)
    pairs = layout.micro_batch * m.seq_length ** 2 / 2 / cp
    core = Gemm(attention_score_flops(s, pairs) / per / tp, tokens, s.kv_channels,
                m.seq_length / cp)
    return gemms, core


def layer_gemms(cfg: Any) -> tuple[list[Gemm], Gemm]:
    """The decoder's mean layer's products on one rank for one micro-batch (averaged over the
    layer kinds), and its attention core apart: what `calibrate=true` divides a measured
    layer's time by (the step model sums each stage's kinds, `kind_forward_seconds`)."""
    return _kind_gemms(cfg, decoder_shape(cfg), cfg.model.num_layers)


def _seconds(g: Gemm, peak: float, fraction: float, half: float) -> float:
    return g.flops / (peak * gemm_efficiency(g, fraction, half)) if g.flops else 0.0


def _selective(cfg: Any, gemms: list[Gemm], core: float, peak: float, fraction: float,
               half: float) -> float:
    """The forward seconds selective recompute repeats of `gemms` and their attention cores
    (`core` seconds): the cores (core_attn), a dense MLP's GEMMs (mlp), an MoE layer's (moe:
    routed experts, latent projections and shared experts, the whole `MoELayer`)."""
    modules = set(cfg.train.recompute_modules)
    extra = core if "core_attn" in modules else 0.0
    return extra + sum(_seconds(g, peak, fraction, half) for g in gemms if g.module in modules)


@dataclass(frozen=True)
class KindSeconds:
    """One decoder layer of one kind (`kinds.LAYER_SYMBOLS`) on one rank, one micro-batch's
    forward."""

    products: float  # its GEMMs
    core: float  # its attention core (what the CP ring overlaps; an attention layer's alone)
    modules: tuple[tuple[str, float], ...]  # of `products`, what each module selective names
    column: float = 0.0  # of `products`, its column-parallel linear's (`Gemm.column`)

    def repeated(self, names: tuple[str, ...] | list[str]) -> float:
        """What selective recompute of the modules `names` runs again: the attention core
        (core_attn), a dense MLP's GEMMs (mlp), an MoE layer's (moe: routed experts, latent
        projections and shared experts, the whole `MoELayer`)."""
        core = self.core if "core_attn" in names else 0.0
        return core + sum(seconds for module, seconds in self.modules if module in names)


def kind_forward_seconds(cfg: Any, peak: float, fraction: float, half: float,
                         ) -> dict[str, KindSeconds]:
    """One layer of each kind the decoder has, in seconds on a device of `peak` FLOP/s: what
    a pipeline stage sums over the layers it holds (a hybrid's stages hold different kinds)."""
    found = {}
    for symbol, count in _shape_counts(decoder_shape(cfg)).items():
        if not count:
            continue
        gemms, core = _kind_gemms(cfg, _shape(cfg, {symbol: 1}, 0), 1)
        timed = [(g, _seconds(g, peak, fraction, half)) for g in gemms]
        modules: dict[str, float] = {}
        for g, seconds in timed:
            if g.module:
                modules[g.module] = modules.get(g.module, 0.0) + seconds
        found[symbol] = KindSeconds(sum(seconds for _, seconds in timed),
                                    _seconds(core, peak, fraction, half), tuple(modules.items()),
                                    sum(g.column * seconds for g, seconds in timed))
    return found


def _shape_counts(s: FlopsShape) -> dict[str, int]:
    return {kinds.ATTENTION: s.attention_layers, kinds.MLP: s.dense_mlp_layers,
            kinds.MOE: s.moe_layers, kinds.MAMBA: s.mamba_layers}


@dataclass(frozen=True)
class StageSeconds:
    """A stage's decoder layers on one rank, one micro-batch: their forward's GEMMs and
    attention cores, and what recompute runs again of them in the backward."""

    products: float
    core: float
    recompute: float


def _stage_seconds(per_kind: dict[str, KindSeconds], counts: dict[str, int],
                   train: Any) -> StageSeconds:
    """The layers `counts` names by kind, each kind at its `per_kind` seconds: full recompute
    reruns every forward, selective the modules it names."""
    products = core = recompute = 0.0
    for symbol, n in counts.items():
        if n:
            kind = per_kind[symbol]
            products, core = products + n * kind.products, core + n * kind.core
            recompute += n * {"full": kind.products + kind.core,
                              "selective": kind.repeated(train.recompute_modules)
                              }.get(train.recompute, 0.0)
    return StageSeconds(products, core, recompute)


@dataclass(frozen=True)
class MtpSeconds:
    """A hybrid model's MTP block on one rank of the last stage, for one micro-batch."""

    forward: float  # every depth: its layers, its input projection, its logits
    recompute: float  # what recompute runs again of it in the backward
    gemms: float  # of `forward`, the layers' and projections' products (TP overlaps them)
    core: float  # of `forward`, the attention cores (what the CP ring overlaps)
    layers: int  # layers the depths run (their kernels)
    projection: float = 0.0  # of `gemms`, one depth's input projection


NO_MTP = MtpSeconds(0.0, 0.0, 0.0, 0.0, 0)  # a model without MTP depths, or a stage but the last


def mtp_seconds(cfg: Any, peak: float, fraction: float, half: float) -> MtpSeconds:
    """The MTP depths' time on the last stage, where Megatron builds and runs them (after the
    decoder, `models/hybrid/hybrid_model.py:217-229`): each depth's layers by kind, its
    projection of [embedding; hidden] (2·hidden -> hidden, column-parallel) and its own logits,
    the FLOPs `flops.py` counts for them. Full recompute reruns a depth's projection once and
    its layers twice (`comm.mtp_recomputed`), not its logits (outside the checkpoint);
    selective recompute the same modules as in a decoder layer."""
    s = mtp_shape(cfg)
    if s is None:
        return NO_MTP
    layout, tp = cfg.layout, cfg.layout.tensor
    tokens = layout.micro_batch * cfg.model.seq_length / layout.context
    gemms, core = _kind_gemms(cfg, s, 1)
    depths, h = s.mtp_depths, s.hidden_size
    projection = Gemm(depths * tokens * mtp_projection_flops(s) / tp, tokens, 2 * h, h / tp)
    logits = Gemm(depths * tokens * logits_flops(s) / tp, tokens, h, layout.padded_vocab / tp)

    def time(g: Gemm) -> float:
        return _seconds(g, peak, fraction, half)

    layers, core_s, proj = sum(time(g) for g in gemms), time(core), time(projection)
    recompute = cfg.train.recompute
    rerun = {"full": mtp_recomputed(cfg) * (layers + core_s) + proj,
             "selective": _selective(cfg, gemms, core_s, peak, fraction, half)
             if recompute == "selective" else 0.0}.get(recompute, 0.0)
    count = len(hybrid.mtp_pattern(cfg.model.hybrid_layer_pattern)) * depths
    return MtpSeconds(layers + core_s + proj + time(logits), rerun, layers + proj, core_s,
                      count, proj / depths)



def layer_forward_seconds(cfg: Any, peak: float, fraction: float, half: float,
                          ) -> tuple[float, float]:
    """(one layer's products, its attention core) for one micro-batch's forward, in seconds,
    on a device of `peak` FLOP/s; the backward's are twice as long."""
    gemms, core = layer_gemms(cfg)
    return sum(_seconds(g, peak, fraction, half) for g in gemms), _seconds(core, peak, fraction,
                                                                           half)


def _traffic_seconds(stage: Any) -> dict[str, float]:
    """Seconds by group; the token dispatcher's expert-TP gathers are timed with its exchange
    (EP), which its overlap schedules with them (`token_dispatch`, `token_combine`)."""
    found: dict[str, float] = {}
    for t in stage.traffic:
        group = "ep" if t.group == "expert-tp" else t.group
        found[group] = found.get(group, 0.0) + t.seconds
    return found


def _dp_exposed(cfg: Any, rows: list[Any], latency_s: float, backward: float,
                forward: float) -> float:
    """The DP reduces and gathers (`rows`: the stage's DP traffic, each row's seconds and
    latency for its collectives) less what hides behind the compute.

    Each gradient reduce hides behind one micro-batch's backward (`optimizer.
    overlap_grad_reduce`): the last one's when a step reduces once; its own when Megatron FSDP
    reduce-scatters every micro-batch's (`comm.dp_passes`). The first weight gather hides behind
    the first micro-batch's forward (`overlap_param_gather`); the others Megatron FSDP's ZeRO-3
    does (forward and backward of every micro-batch) behind the whole step's compute. The
    split and the counts are the traffic's own, so FP8 weights gathered in one byte shrink the
    gathers and not the reduces."""
    o, micro = cfg.optimizer, cfg.layout.microbatches

    def part(weights: bool) -> tuple[float, int]:
        chosen = [t for t in rows if t.weights == weights]
        return (sum(t.seconds + t.collectives * latency_s for t in chosen),
                max((t.passes for t in chosen), default=0))

    (reduce, reduces), (gather, gathers) = part(False), part(True)
    hidden_reduce = backward if o.overlap_grad_reduce else 0.0
    hidden_gather = forward if o.overlap_param_gather else 0.0
    exposed = max(0.0, reduce - reduces * hidden_reduce)
    if gathers:
        each = gather / gathers
        exposed += max(0.0, each - hidden_gather)
        exposed += max(0.0, (gathers - 1) * each - (forward + backward) * micro)
    return exposed


def column_hidden(stage: Any, behind: dict[str, float],
                  latency_s: float = 0.0) -> tuple[float, float]:
    """TP seconds of `stage` (a `build.StagePlan`) that column-parallel linears' backward hides
    (`comm.Hideable`): Megatron launches the input's gradient reduce (`allreduce_dgrad`, or
    the SP reduce-scatter) before the weight-gradient GEMM and, with SP, the input's re-gather
    before the input-gradient GEMM, both asynchronous
    (`LinearWithGradAccumulationAndAsyncCommunication.backward`), so each collective hides
    behind one of the linear's backward GEMMs: one forward GEMM's seconds here, as the backward
    is twice the forward (`behind`, by `Hideable.linear`), and is exposed beyond it. A
    collective's time is its bytes' and its `latency_s`; (bytes' seconds hidden, latency's)."""
    sent = waited = 0.0
    for h in (h for t in stage.traffic for h in t.hideable):
        window = h.collectives * behind.get(h.linear, 0.0)
        hidden = min(h.seconds, window)
        sent, waited = sent + hidden, waited + min(h.collectives * latency_s, window - hidden)
    return sent, waited


def _overlapped(cfg: Any, comm: dict[str, float], gemms: float, compute: float,
                column: float) -> dict[str, float]:
    """TP traffic less what its overlap hides behind the layers' GEMMs (`gemms`: forward and
    backward of every micro-batch), or without it less what the column-parallel linears'
    backward hides (`column`, `column_hidden`: the userbuffers overlap covers those
    collectives too); EP traffic less what its overlap hides behind the other micro-batch's
    layers (`compute`). Each is bounded by the compute alone, not by what the other already
    hides behind it: the two run on streams of their own (userbuffers or NCCL for TP, the
    dispatcher's all-to-alls for EP) beside one compute stream, so the same GEMM can hide both.
    What this leaves out is their competing for one link when TP and EP share a node's NVLink
    and for the SMs their kernels take; with both overlaps on, the modeled step is a lower
    bound in that respect."""
    p, found = cfg.parallel, dict(comm)
    if "tp" in found:
        found["tp"] = max(0.0, found["tp"] - (gemms if p.tp_comm_overlap else column))
    if p.ep_comm_overlap and "ep" in found:
        found["ep"] = max(0.0, found["ep"] - compute)
    return found


def collective_counts(stage: Any) -> dict[str, float]:
    """Collectives one rank of `stage` (a `build.StagePlan`) starts in one step, by group: its
    traffic's own counts (`comm.stage_traffic`, from the stage's layers by kind), so the
    latency term prices the collectives the communication table sends: TP per sublayer and
    pass (on the last stage each head's output layer and loss too, `comm.OUTPUT_LAYERS`), CP's
    ring steps in attention layers and all-to-alls in Mamba layers, EP's dispatch and combine
    in every MoE layer the stage runs (`comm.moe_passes`: the last stage's MTP depths' too),
    PP's sends and receives, DP's reduces and gathers."""
    found = dict.fromkeys(("tp", "cp", "ep", "pp", "dp-cp", "expert-tp", "expert-dp"), 0.0)
    for t in stage.traffic:
        found[t.group] = found.get(t.group, 0.0) + t.collectives
    return found


def host_cores_bound(rank_compute: list[float], exposed_comm: float,
                     host_cores: int | None) -> float:
    """The shortest step a node whose ranks share `host_cores` CPU cores can take: the
    compute seconds per step of each of its ranks (`rank_compute`, as if each had a core of
    its own) spread over the cores, plus the communication no rank can overlap (`exposed_comm`,
    during which the ranks wait together). A rank idling in the pipeline bubble or in a
    collective's wait lends its core to the others, so this is a bound, not a sum; 0 when the
    cores are not oversubscribed (or not known: a core, or a GPU, per rank)."""
    if host_cores is None or len(rank_compute) <= host_cores:
        return 0.0
    return sum(rank_compute) / host_cores + exposed_comm


def busiest_node_compute(layout: Any, stage_compute: dict[int, float]) -> list[float]:
    """The compute seconds per step of each rank on the node whose ranks compute the most,
    from each pipeline stage's (`stage_compute`, by stage) and where the ranks sit."""
    gpn = layout.gpus_per_node
    nodes = [[stage_compute[layout.coordinates(node * gpn + gpu).pp] for gpu in range(gpn)]
             for node in range(layout.world_size // gpn)]
    return max(nodes, key=sum)


def step_time(cfg: Any, stages: list[Any], peak_tflops: float, *,
              peak_fraction: float = PEAK_FRACTION, half_dim: float = HALF_DIM,
              latency_s: float = 0.0, kernel_s: float = 0.0,
              host_cores: int | None = None,
              forward: dict[str, KindSeconds] | None = None) -> StepTime:
    """The modeled step of `cfg` whose stage plans (`recipes.plan.build.stage_plans`) are
    `stages`, on GPUs of `peak_tflops` dense TFLOP/s, each collective costing `latency_s`
    beyond its bytes, each node's ranks sharing `host_cores` CPU cores (None: one each).
    `forward` (`kind_forward_seconds` of `cfg` at this peak, fraction and half) may be handed
    in by a caller that holds it from a layout with the same layer products (the search).
    Each stage's layers are timed by their kinds (`params.stage_kinds`)."""
    layout, t = cfg.layout, cfg.train
    peak = peak_tflops * 1e12
    per_kind = forward or kind_forward_seconds(cfg, peak, peak_fraction, half_dim)
    held = stage_kinds(cfg)
    shape = FlopsShape.from_config(cfg)
    tokens = layout.micro_batch * cfg.model.seq_length / layout.context
    logits = Gemm(tokens * logits_flops(shape) / layout.tensor, tokens, shape.hidden_size,
                  layout.padded_vocab / layout.tensor)
    micro = layout.microbatches
    mtp = mtp_seconds(cfg, peak, peak_fraction, half_dim)
    behind = {symbol: kind.column for symbol, kind in per_kind.items()}
    # The column backward's overlap relies on CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's
    # comments in `LinearWithGradAccumulationAndAsyncCommunication.backward`), which runs
    # are launched without under Megatron FSDP (Megatron-LM refuses the two together): there a
    # later GEMM may overtake the collective, so nothing is hidden.
    ordered = cfg.optimizer.fsdp == "none"
    behind[OUTPUT_LAYERS] = _seconds(logits, peak, peak_fraction, half_dim)
    behind[MTP_PROJECTIONS] = mtp.projection
    mtp_kernels = mtp.layers * KERNELS_PER_LAYER * (3 + mtp_recomputed(cfg)) * kernel_s
    worst: tuple[float, ...] = ()
    stage_compute: dict[int, float] = {}
    for stage in stages:
        layers = sum(stage.layers)
        last = stage.stage == len(stages) - 1
        head = mtp if last else NO_MTP  # the MTP depths run on the last stage alone
        own = _stage_seconds(per_kind, held[stage.stage], t)
        forward = own.products + own.core + head.forward
        if last:
            forward += _seconds(logits, peak, peak_fraction, half_dim)
        per_micro = (3 * forward + own.recompute + head.recompute
                     + layers * layer_kernels(t.recompute) * kernel_s
                     + (mtp_kernels if last else 0.0))
        column, column_waits = (column_hidden(stage, behind, latency_s) if ordered
                                and not cfg.parallel.tp_comm_overlap else (0.0, 0.0))
        comm = _overlapped(cfg, _traffic_seconds(stage),
                           micro * 3 * (own.products + head.gemms),
                           micro * 3 * (own.products + own.core + head.forward), column)
        waits = {group: count * latency_s
                 for group, count in collective_counts(stage).items()}
        comm["tp"] = comm.get("tp", 0.0) + waits["tp"] - column_waits
        comm["ep"] = comm.get("ep", 0.0) + waits["ep"] + waits["expert-tp"]
        ring = micro * ((3 + recomputed(cfg, "core_attn")) * own.core
                        + (3 + mtp_recomputed(cfg, "core_attn")) * head.core)  # overlapped
        kv = sum(t.seconds for t in stage.traffic if t.operation == KV_RING)
        cp = max(0.0, kv - ring) + comm.get("cp", 0.0) - kv + waits["cp"]
        busy = micro * per_micro + comm.get("tp", 0.0) + cp + comm.get("ep", 0.0)
        fill = (layout.pipeline - 1) / (micro * layout.virtual_stages)
        pp = comm.get("pp", 0.0) * min(1.0, fill) + waits["pp"]
        dp = _dp_exposed(cfg, [t for t in stage.traffic if t.group in ("dp-cp", "expert-dp")],
                         latency_s, 2 * forward, forward)
        stage_compute[stage.stage] = micro * per_micro
        row = (busy, micro * per_micro, busy / micro, comm.get("tp", 0.0), cp,
               comm.get("ep", 0.0), pp, dp)
        worst = max(worst, row) if worst else row
    busy, compute, per_micro, tp, cp, ep, pp, dp = worst
    bubble = (layout.pipeline - 1) / layout.virtual_stages * per_micro
    per_rank = StepTime(compute=compute, bubble=bubble, tp=tp, cp=cp, ep=ep, pp=pp, dp=dp)
    if host_cores is None or layout.gpus_per_node <= host_cores:
        return per_rank
    bound = host_cores_bound(busiest_node_compute(layout, stage_compute),
                             tp + cp + ep + pp + dp, host_cores)
    return dataclasses.replace(per_rank, cores=max(0.0, bound - per_rank.total))

"""Activation memory per GPU: what a layer keeps for its backward, times what is in flight.

Per layer and token the terms are Korthikanti et al. (2022, "Reducing activation
recomputation", Table 2), written per tensor so GQA, gated MLPs, dropout off, FP32, CP and MoE
come out right: norm inputs, QKV input, Q/K/V, the attention scores (explicit attention keeps
softmax output, dropout mask and dropout output per head and key; flash attention keeps only a
FP32 log-sum-exp per head), projection input, MLP input, activation input and output, and the
one-byte dropout masks when dropout is on. Tensor parallel splits the matmul-side tensors;
sequence parallel also splits the rest; context parallel splits the sequence. Selective
recompute drops the attention-score terms; full recompute keeps each block's input and rebuilds
one block's activations at a time. A hybrid model's layers are counted by kind: attention,
MLP and MoE layers keep their half of a GPT layer's terms; a Mamba2 layer keeps its norm and
in_proj inputs, the in_proj output (z, x, B, C, dt; the fused path rebuilds the conv from it),
the scan output and the gated norm's output (out_proj's input), FP32 dt and its decay cumsum
per head, and the FP32 state at every chunk boundary. A latent MoE's routed copies are
latent-wide, and it keeps the input of each latent projection. A hybrid model's MTP depths
(last stage) keep their layers' terms by kind, the inputs of their two norms and of their
projection, and one more final norm, output-layer input and FP32 logits each. Differences from
Megatron-LM's own estimator are deliberate and listed in docs/planner.md.

Selective recompute by module (`train.recompute_modules`) and activation offloading
(`train.offload_modules`) take named tensors off those terms (`dropped_per_token`): core_attn
the scores, layernorm the norms' outputs (QKV and MLP inputs), mlp a dense MLP's inner
activations, moe an MoE layer's routed copies and router logits, moe_act the expert activation's
output; offloading moves the inputs of its modules to host memory until the backward. CUDA
graphs add their static buffers (`cuda_graph_static_bytes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from recipes.models import kinds
from recipes.models.hybrid import pattern as hybrid
from recipes.plan.params import stage_kinds, stage_layer_counts
from recipes.plan.schedule import layer_microbatches_in_flight

Attention = Literal["flash", "explicit"]
_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def tensor_bytes(*shape: int, element_bytes: int = 2) -> int:
    """Bytes of a dense tensor: [2, 2048, 4096] in BF16 is 32 MiB."""
    total = element_bytes
    for size in shape:
        total *= size
    return total


def score_bytes(batch: int, heads: float, length: int, element_bytes: int = 2) -> float:
    """One explicit attention-score matrix per head: b·h·n² elements."""
    return tensor_bytes(batch, heads, length, length, element_bytes=element_bytes)


@dataclass(frozen=True)
class LayerTerms:
    """Bytes per token of one transformer layer on one rank, by how TP/SP split them."""

    split: float  # divided by TP already (matmul inputs/outputs inside the TP region)
    replicated: float  # full on every TP rank unless sequence parallel splits it
    scores: float  # attention scores (explicit) or log-sum-exp (flash), divided by TP


def _attention_terms(m: Any, d: int, attention: Attention, keys: int, tp: int) -> LayerTerms:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value = heads * width, 2 * groups * width
    masks = m.hidden_size if m.hidden_dropout > 0 else 0
    replicated = 2 * d * m.hidden_size + masks  # norm input, QKV input, dropout mask
    split = d * (query + key_value) / tp + d * query / tp  # Q, K, V and projection input
    if attention == "explicit":
        per_key = d + ((1 + d) if m.attention_dropout > 0 else 0)
        scores = score_bytes(1, heads / tp, keys, element_bytes=per_key) / keys
    else:
        scores = 4 * heads / tp  # FP32 log-sum-exp per head
    return LayerTerms(split=split, replicated=replicated, scores=scores)


def _mlp_terms(m: Any, d: int, layout: Any) -> LayerTerms:
    h = m.hidden_size
    gate = 2 if m.activation == "swiglu" else 1
    masks = h if m.hidden_dropout > 0 else 0
    replicated = 2 * d * h + masks  # norm input, MLP input, dropout mask
    if not m.num_moe_experts:
        ffn = m.ffn_hidden_size
        return LayerTerms(split=d * ffn * (gate + 1) / layout.tensor, replicated=replicated,
                          scores=0.0)
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    topk, etp = m.moe_router_topk, layout.expert_tensor_size
    x = m.moe_latent_size or h  # the width routed experts read and write
    # Each routed copy: expert input, activation input and output; then the unpermuted output.
    routed = topk * (d * x + d * ffn * (gate + 1) / etp + d * x)
    router = 4 * m.num_moe_experts  # FP32 router logits
    latent = d * (h + x) if m.moe_latent_size else 0  # the two latent projections' inputs
    return LayerTerms(split=routed / layout.tensor, replicated=replicated + router + latent,
                      scores=0.0)


def _mamba_terms(m: Any, d: int, tp: int) -> LayerTerms:
    h, heads = m.hidden_size, hybrid.mamba_heads(m)
    inner, bc = heads * m.mamba_head_dim, 2 * m.mamba_num_groups * m.mamba_state_dim
    masks = h if m.hidden_dropout > 0 else 0
    replicated = 2 * d * h + masks  # norm input, in_proj input, dropout mask
    kept = d * (2 * inner + bc + heads) + 2 * d * inner  # in_proj out, scan out, norm out
    fp32 = 2 * 4 * heads + 4 * inner * m.mamba_state_dim / m.mamba_chunk_size  # dt, dA, states
    return LayerTerms(split=(kept + fp32) / tp, replicated=replicated, scores=0.0)


def symbol_bytes_per_token(cfg: Any, symbol: str, attention: Attention) -> LayerTerms:
    """Bytes per token one hybrid layer of kind `symbol` keeps on one rank."""
    m, layout = cfg.model, cfg.layout
    d = _ACT_BYTES[cfg.precision.dtype]
    if symbol == kinds.MAMBA:
        return _mamba_terms(m, d, layout.tensor)
    if symbol == kinds.ATTENTION:
        return _attention_terms(m, d, attention, m.seq_length // layout.context, layout.tensor)
    if symbol == kinds.MLP:
        dense = dataclasses.replace(m, num_moe_experts=None)
        return _mlp_terms(dense, d, layout)
    return _mlp_terms(m, d, layout)


def layer_bytes_per_token(cfg: Any, attention: Attention) -> LayerTerms:
    m, layout = cfg.model, cfg.layout
    d = _ACT_BYTES[cfg.precision.dtype]
    att = _attention_terms(m, d, attention, m.seq_length // layout.context, layout.tensor)
    mlp = _mlp_terms(m, d, layout)
    return LayerTerms(att.split + mlp.split, att.replicated + mlp.replicated, att.scores)


def attention_score_bytes(cfg: Any) -> float:
    """What explicit (unfused) attention keeps of its scores in one layer for one micro-batch
    on one rank: b x heads/TP x s x s x bytes per score (softmax output, and the dropout mask
    and output when attention dropout is on), the planner's own score term."""
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length // cfg.layout.context
    return tokens * layer_bytes_per_token(cfg, "explicit").scores


def _recomputed(cfg: Any, recompute: str | None = None) -> set[str]:
    t = cfg.train
    return set(t.recompute_modules) if (recompute or t.recompute) == "selective" else set()


def _attention_dropped(m: Any, d: int, tp: int, recomputed: set[str],
                       offloaded: set[str]) -> LayerTerms:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value = heads * width, 2 * groups * width
    h = m.hidden_size
    replicated = d * h * ("attn_norm" in offloaded)  # the norm's input
    replicated += d * h * bool({"layernorm"} & recomputed or {"qkv_linear"} & offloaded)
    split = d * (query + key_value) / tp * ("core_attn" in offloaded)  # Q, K, V
    split += d * query / tp * ("attn_proj" in offloaded)  # the projection's input
    return LayerTerms(split=split, replicated=replicated, scores=0.0)


def _mlp_dropped(m: Any, d: int, layout: Any, recomputed: set[str],
                 offloaded: set[str]) -> LayerTerms:
    h, gate = m.hidden_size, 2 if m.activation == "swiglu" else 1
    replicated = d * h * ("mlp_norm" in offloaded) + d * h * ("layernorm" in recomputed)
    if not m.num_moe_experts:
        inner = d * m.ffn_hidden_size * (gate + 1) / layout.tensor
        return LayerTerms(split=inner * ("mlp" in recomputed), replicated=replicated,
                          scores=0.0)
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    topk, etp = m.moe_router_topk, layout.expert_tensor_size
    if "moe" in recomputed:  # the whole MoE layer: only its input is kept
        routed = topk * (d * h + d * ffn * (gate + 1) / etp + d * h)
        return LayerTerms(split=routed / layout.tensor,
                          replicated=replicated + 4 * m.num_moe_experts, scores=0.0)
    routed = topk * d * ffn / etp * ("moe_act" in recomputed)  # the activation's output
    routed += topk * d * ffn * gate / etp * ("moe_act" in offloaded)  # its input
    routed += topk * d * h * ("expert_fc1" in offloaded)  # the experts' input
    return LayerTerms(split=routed / layout.tensor, replicated=replicated, scores=0.0)


def dropped_per_token(cfg: Any, symbol: str | None = None,
                      recompute: str | None = None) -> LayerTerms:
    """Bytes per token one layer (of kind `symbol`; a GPT layer: attention and its MLP or MoE)
    no longer keeps on the GPU: selective recompute's modules and activation offloading's, the
    scores apart (`layer_bytes` drops them for core_attn)."""
    m, layout = cfg.model, cfg.layout
    d = _ACT_BYTES[cfg.precision.dtype]
    recomputed, offloaded = _recomputed(cfg, recompute), set(cfg.train.offload_modules)
    if not recomputed and not offloaded:
        return LayerTerms(0.0, 0.0, 0.0)
    symbols = kinds.gpt_layer_kinds(m) if symbol is None else (symbol,)
    split = replicated = 0.0
    for kind in symbols:
        if kind == kinds.ATTENTION:
            part = _attention_dropped(m, d, layout.tensor, recomputed, offloaded)
        elif kind == kinds.MLP:
            part = _mlp_dropped(dataclasses.replace(m, num_moe_experts=None), d, layout,
                                recomputed, offloaded)
        elif kind == kinds.MOE:
            part = _mlp_dropped(m, d, layout, recomputed, offloaded)
        else:
            continue  # a Mamba layer: neither recomputed by module nor offloaded
        split, replicated = split + part.split, replicated + part.replicated
    return LayerTerms(split=split, replicated=replicated, scores=0.0)


def layer_bytes(cfg: Any, attention: Attention, recompute: str | None = None,
                symbol: str | None = None) -> float:
    """Bytes one layer (of a hybrid model: of kind `symbol`) keeps for one micro-batch on one
    rank (no recompute, or selective by module), less what activation offloading moves to
    host memory."""
    layout, t = cfg.layout, cfg.train
    terms = (layer_bytes_per_token(cfg, attention) if symbol is None
             else symbol_bytes_per_token(cfg, symbol, attention))
    dropped = dropped_per_token(cfg, symbol, recompute)
    tokens = t.micro_batch_size * cfg.model.seq_length // layout.context
    replicated = (terms.replicated - dropped.replicated) / (
        layout.tensor if layout.sequence_parallel else 1)
    scores = 0.0 if "core_attn" in _recomputed(cfg, recompute) else terms.scores
    return tokens * (terms.split - dropped.split + replicated + scores)


# What each graphed module of a layer captures, by the layer kinds it covers
# (transformer_config.py:1047-1062); no module named: the whole layer.
GRAPHED_KINDS = {"attn": kinds.ATTENTION, "mamba": kinds.MAMBA, "mlp": kinds.MLP,
                 "moe_router": kinds.MOE, "moe_preprocess": kinds.MOE, "moe": kinds.MOE}


def cuda_graph_static_bytes(cfg: Any, stage_counts: dict[str, int] | None,
                            layers: int) -> float:
    """Static memory of Transformer Engine's CUDA graphs on one rank of a stage holding `layers`
    layers (of a hybrid model: `stage_counts` by kind): each graph keeps its own input and
    output hidden states and their gradients (4 x tokens x hidden), one graph per graphed
    module, layer and captured micro-batch: one without pipelining, every micro-batch of the
    step with it (Megatron allocates sample arguments per layer and micro-batch,
    transformer/cuda_graphs.py:2291, 2506-2512). The graph pool's fragmentation is not
    modeled."""
    t, layout, m = cfg.train, cfg.layout, cfg.model
    if t.cuda_graphs == "none":
        return 0.0
    captured = 1 if layout.pipeline == 1 else layout.microbatches
    d = _ACT_BYTES[cfg.precision.dtype]
    hidden = _tokens(cfg) * m.hidden_size * d / (
        layout.tensor if layout.sequence_parallel else 1)
    modules = {GRAPHED_KINDS[name] for name in t.cuda_graph_modules if name in GRAPHED_KINDS}
    if stage_counts is None:  # a GPT layer: attention and its MLP or MoE
        layer_kinds = kinds.gpt_layer_kinds(m)
        graphs = layers * (1 if not modules else len(modules & set(layer_kinds)))
    else:
        graphs = sum(n for kind, n in stage_counts.items() if not modules or kind in modules)
    return graphs * captured * 4 * hidden


def _tokens(cfg: Any) -> float:
    layout = cfg.layout
    return cfg.train.micro_batch_size * cfg.model.seq_length / layout.context


def checkpoint_bytes(cfg: Any) -> float:
    """Full recompute: the input kept per recompute block of one micro-batch."""
    layout = cfg.layout
    d = _ACT_BYTES[cfg.precision.dtype]
    split = layout.tensor if layout.sequence_parallel else 1
    return _tokens(cfg) * d * cfg.model.hidden_size / split


def embedding_bytes(cfg: Any) -> float:
    """First stage, per micro-batch in flight: token ids (8 bytes) and the embedding dropout
    mask, split by TP under sequence parallel (Megatron's estimator's terms)."""
    layout, m = cfg.layout, cfg.model
    mask = m.hidden_size if m.hidden_dropout > 0 else 0
    split = layout.tensor if layout.sequence_parallel else 1
    return _tokens(cfg) * (8 + mask) / split


def output_bytes(cfg: Any) -> float:
    """Last stage, one micro-batch: final-norm and output-layer inputs, FP32 logits for the
    vocabulary-parallel cross entropy (the vocabulary is split over TP)."""
    layout, m = cfg.layout, cfg.model
    d = _ACT_BYTES[cfg.precision.dtype]
    split = layout.tensor if layout.sequence_parallel else 1
    return _tokens(cfg) * (2 * d * m.hidden_size / split + 4 * layout.padded_vocab / layout.tensor)


def _stage_layer_bytes(cfg: Any, attention: Attention,
                       layers: list[int]) -> list[tuple[float, float]]:
    """Per stage (holding `layers` layers), (mean, largest) bytes of one of its layers for one
    micro-batch: every GPT layer alike, a hybrid model's by kind."""
    if not cfg.model.is_hybrid:
        full = layer_bytes(cfg, attention)
        return [(full, full)] * len(layers)
    found = []
    for counts, count in zip(stage_kinds(cfg), layers, strict=True):
        sizes = {symbol: layer_bytes(cfg, attention, symbol=symbol)
                 for symbol, n in counts.items() if n}
        total = sum(counts[symbol] * size for symbol, size in sizes.items())
        found.append((total / max(count, 1), max(sizes.values(), default=0.0)))
    return found


def mtp_bytes(cfg: Any, attention: Attention) -> tuple[float, float]:
    """A hybrid model's MTP block for one micro-batch on one rank of the last stage: (its
    layers and projections, its logits and loss). Each depth keeps its layers' terms, the
    inputs of the embedding and hidden-state norms and of the 2·hidden-wide projection, and
    then a final norm, output-layer input and FP32 logits like the main head's
    (`transformer/multi_token_prediction.py:1128-1153, 857-861`)."""
    m = cfg.model
    depths = hybrid.mtp_depths(m.hybrid_layer_pattern) if m.is_hybrid else 0
    if not depths:
        return 0.0, 0.0
    layout = cfg.layout
    d = _ACT_BYTES[cfg.precision.dtype]
    split = layout.tensor if layout.sequence_parallel else 1
    layers = sum(layer_bytes(cfg, attention, symbol=symbol)
                 for symbol in hybrid.mtp_pattern(m.hybrid_layer_pattern))
    projection = _tokens(cfg) * 4 * d * m.hidden_size / split
    return depths * (layers + projection), depths * output_bytes(cfg)


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes on one rank of one pipeline stage at its peak."""

    stage: int
    layers: int
    in_flight: float  # micro-batches' worth of the stage's layers held
    per_layer: float  # one layer, one micro-batch (what recompute leaves kept)
    layers_total: float
    embedding: float
    output: float
    recompute_working: float  # full recompute: one block rebuilt during backward
    cuda_graphs: float = 0.0  # CUDA graphs' static buffers
    mtp: float = 0.0  # the last stage's MTP depths: their layers in flight, logits and loss

    @property
    def total(self) -> float:
        return (self.layers_total + self.embedding + self.output + self.recompute_working
                + self.cuda_graphs + self.mtp)


def stage_activations(cfg: Any, attention: Attention) -> list[StageActivations]:
    """Each stage's activations at its peak (the first stage holds the most micro-batches)."""
    layout, t = cfg.layout, cfg.train
    stages = stage_layer_counts(cfg)
    block = t.recompute_num_layers
    result = []
    per_stage = _stage_layer_bytes(cfg, attention, [sum(chunks) for chunks in stages])
    counts = stage_kinds(cfg) if cfg.model.is_hybrid else [None] * len(stages)
    for stage, (chunks, (full, largest)) in enumerate(zip(stages, per_stage, strict=True)):
        layers = sum(chunks)
        flight = layer_microbatches_in_flight(stage, layout.pipeline, layout.virtual_stages,
                                              layout.microbatches)
        if t.recompute == "full":
            per_layer = checkpoint_bytes(cfg) / block
            working = largest * min(block, max(chunks))
        else:
            per_layer, working = full, 0.0
        embedding = embedding_bytes(cfg) * flight if stage == 0 else 0.0
        last = stage == len(stages) - 1
        output = output_bytes(cfg) if last else 0.0
        graphs = cuda_graph_static_bytes(cfg, counts[stage], layers)
        mtp_layers, mtp_logits = mtp_bytes(cfg, attention) if last else (0.0, 0.0)
        result.append(StageActivations(stage, layers, flight, per_layer,
                                       per_layer * layers * flight, embedding, output, working,
                                       graphs, mtp_layers * flight + mtp_logits))
    return result

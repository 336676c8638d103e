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
projection, and one more final norm, output-layer input and FP32 logits each; under full
recompute each depth keeps only its two inputs, its output-layer input and logits, and one
depth is rebuilt at a time, like the decoder's blocks (`mtp_bytes`, `mtp_rebuild_bytes`). The
last stage's heads are at their largest at the main head's loss, when every head's FP32 logits
are kept and the main head's BF16 logits are held beside the copy the loss casts
(`cast_logits_bytes`). Under full recompute its peak is the larger of two phases of the
backward (`StageActivations.total`): the heads' (their memory, an MTP depth rebuilt beside it)
and the decoder's block rebuild, which comes after every head's backward has freed its logits.
Differences from Megatron-LM's own estimator are deliberate and listed in docs/planner.md.

Selective recompute by module (`train.recompute_modules`) and activation offloading
(`train.offload_modules`) take named tensors off those terms (`dropped_per_token`): core_attn
the scores, layernorm the norms' outputs (QKV and MLP inputs), mlp a dense MLP's inner
activations (and its FC1's input where Transformer Engine's FC1 holds the norm), moe an MoE
layer's routed copies and router logits, moe_act the expert activation's output; offloading
moves the inputs of its modules to host memory until the backward. On Transformer Engine's
layers the attention and dense MLP norms are fused into the next linear (`fused_norms`). CUDA
graphs add their static buffers (`cuda_graph_static_bytes`).

FP8 and FP4 (a plugin's `GemmInputs`, `saved_input_bytes`): under Transformer Engine's autocast a
linear that quantizes its input for the GEMM saves that quantized tensor for the backward, with
its row-wise data discarded, instead of the BF16 input (TE v2.18, 27486e0,
transformer_engine/pytorch/module/linear.py:556-577; a column-parallel linear under sequence
parallel whose quantizer gathers only row-wise data keeps that instead, the same bytes,
:564-569). LayerNormLinear does the same with the norm's output and keeps the norm's input in
the activation dtype (layernorm_linear.py:450-472); GroupedLinear with each expert's input
(grouped_linear.py:713-725). So in every layer outside the BF16 ends (the global numbering of
`gemm_weights.stage_layer_numbers`, `in_low_precision`) these are priced at the recipe's bytes
per element (1; blockwise and MXFP8 1 + 1/32; NVFP4 0.5 + 1/16, scales included,
`plugins/fp8/config.py` SAVED_INPUT_BYTES): the QKV input (the fused norm's output), a dense
MLP's fc1 input (ditto) and fc2 input (the activation's output), each routed copy's expert fc1
and fc2 inputs, a latent MoE's two projection inputs, Mamba's in_proj input (the fused norm's
output) and out_proj input (the gated norm's output). The attention projection's input is core
attention's output, which TE's attention keeps in BF16 for its own backward
(attention/dot_product_attention/backends.py:1547-1550, 1572-1581): its quantized copy is
priced beside it. Unchanged: the norms' inputs, an MoE layer's input (its router keeps it in
BF16), Q/K/V, scores and LSE, the activation's input, dropout masks, router logits, the
embedding, the output layer and logits, Mamba's FP32 terms, full recompute's checkpoints, and
the MTP depths (priced as BF16: Megatron runs them under other quantization contexts,
transformer/multi_token_prediction.py:1056-1061, 1179-1196). Recompute and offloading drop each
tensor at the size the layer holds it: Megatron has the linear save its BF16 input where a
recomputed norm or activation would discard it (`set_save_original_input`,
transformer/transformer_layer.py:452-513, moe/experts.py:272-283), so nothing of it is held.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from recipes.config.schema import uses_transformer_engine
from recipes.models import kinds
from recipes.models.hybrid import pattern as hybrid
from recipes.plan.gemm_weights import in_low_precision, stage_layer_numbers
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


def _attention_terms(m: Any, d: int, attention: Attention, keys: int, tp: int,
                     q: float | None = None) -> LayerTerms:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value = heads * width, 2 * groups * width
    masks = m.hidden_size if m.hidden_dropout > 0 else 0
    qkv_input = d if q is None else q  # the fused norm's output, saved quantized by FP8
    replicated = d * m.hidden_size + qkv_input * m.hidden_size + masks  # norm, QKV inputs, mask
    split = d * (query + key_value) / tp + d * query / tp  # Q, K, V and projection input
    if q is not None:  # core attention keeps its output; the projection saves a quantized copy
        split += q * query / tp
    if attention == "explicit":
        per_key = d + ((1 + d) if m.attention_dropout > 0 else 0)
        scores = score_bytes(1, heads / tp, keys, element_bytes=per_key) / keys
    else:
        scores = 4 * heads / tp  # FP32 log-sum-exp per head
    return LayerTerms(split=split, replicated=replicated, scores=scores)


def _mlp_terms(m: Any, d: int, layout: Any, q: float | None = None) -> LayerTerms:
    h = m.hidden_size
    gate = 2 if m.activation == "swiglu" else 1
    masks = h if m.hidden_dropout > 0 else 0
    i = d if q is None else q  # a TE linear's saved input: quantized in the FP8 region
    if not m.num_moe_experts:
        ffn = m.ffn_hidden_size
        replicated = d * h + i * h + masks  # norm input, fc1 input (the fused norm's output)
        return LayerTerms(split=(d * ffn * gate + i * ffn) / layout.tensor,  # act. in, fc2 in
                          replicated=replicated, scores=0.0)
    replicated = 2 * d * h + masks  # norm input, MLP input (the router keeps it), dropout mask
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    topk, etp = m.moe_router_topk, layout.expert_tensor_size
    x = m.moe_latent_size or h  # the width routed experts read and write
    # Each routed copy: expert input, activation input and output; then the unpermuted output.
    routed = topk * (i * x + (d * ffn * gate + i * ffn) / etp + d * x)
    router = 4 * m.num_moe_experts  # FP32 router logits
    latent = i * (h + x) if m.moe_latent_size else 0  # the two latent projections' inputs
    return LayerTerms(split=routed / layout.tensor, replicated=replicated + router + latent,
                      scores=0.0)


def _mamba_terms(m: Any, d: int, tp: int, q: float | None = None) -> LayerTerms:
    h, heads = m.hidden_size, hybrid.mamba_heads(m)
    inner, bc = heads * m.mamba_head_dim, 2 * m.mamba_num_groups * m.mamba_state_dim
    masks = h if m.hidden_dropout > 0 else 0
    i = d if q is None else q  # in_proj's and out_proj's saved inputs
    replicated = d * h + i * h + masks  # norm input, in_proj input, dropout mask
    kept = d * (2 * inner + bc + heads) + d * inner + i * inner  # in_proj out, scan, norm out
    fp32 = 2 * 4 * heads + 4 * inner * m.mamba_state_dim / m.mamba_chunk_size  # dt, dA, states
    return LayerTerms(split=(kept + fp32) / tp, replicated=replicated, scores=0.0)


def saved_input_bytes(cfg: Any, low: bool = True) -> float | None:
    """Bytes per element of what a TE linear saves of its input for the backward in a layer
    inside (`low`) a plugin's FP8/FP4 region: the quantized copy (`GemmInputs`), or None where
    the input stays in the run's dtype (no such plugin, or a BF16 end layer)."""
    inputs = cfg.plugins.gemm_inputs(cfg) if low else None
    return None if inputs is None else inputs.bytes_per_element


def symbol_bytes_per_token(cfg: Any, symbol: str, attention: Attention,
                           low: bool = True) -> LayerTerms:
    """Bytes per token one hybrid layer of kind `symbol` keeps on one rank (`low`: priced as a
    layer of the FP8/FP4 region when a plugin quantizes; False: a BF16 end layer)."""
    m, layout = cfg.model, cfg.layout
    d, q = _ACT_BYTES[cfg.precision.dtype], saved_input_bytes(cfg, low)
    if symbol == kinds.MAMBA:
        return _mamba_terms(m, d, layout.tensor, q)
    if symbol == kinds.ATTENTION:
        return _attention_terms(m, d, attention, m.seq_length // layout.context, layout.tensor,
                                q)
    if symbol == kinds.MLP:
        dense = dataclasses.replace(m, num_moe_experts=None)
        return _mlp_terms(dense, d, layout, q)
    return _mlp_terms(m, d, layout, q)


def layer_bytes_per_token(cfg: Any, attention: Attention, low: bool = True) -> LayerTerms:
    m, layout = cfg.model, cfg.layout
    d, q = _ACT_BYTES[cfg.precision.dtype], saved_input_bytes(cfg, low)
    att = _attention_terms(m, d, attention, m.seq_length // layout.context, layout.tensor, q)
    mlp = _mlp_terms(m, d, layout, q)
    return LayerTerms(att.split + mlp.split, att.replicated + mlp.replicated, att.scores)


def attention_score_bytes(cfg: Any) -> float:
    """What explicit (unfused) attention keeps of its scores in one layer for one micro-batch
    on one rank: b x heads/TP x s x s x bytes per score (softmax output, and the dropout mask
    and output when attention dropout is on), the planner's own score term."""
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length // cfg.layout.context
    return tokens * layer_bytes_per_token(cfg, "explicit", low=False).scores


def _recomputed(cfg: Any, recompute: str | None = None) -> set[str]:
    t = cfg.train
    return set(t.recompute_modules) if (recompute or t.recompute) == "selective" else set()


def _attention_dropped(m: Any, d: int, tp: int, recomputed: set[str],
                       offloaded: set[str], q: float | None, te_layers: bool) -> LayerTerms:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value = heads * width, 2 * groups * width
    h, i = m.hidden_size, d if q is None else q
    # TE's QKV linear holds the norm: offloading it moves the norm's input too, and there is
    # no norm module to recompute or offload on its own (`fused_norms`)
    norm = "qkv_linear" if te_layers else "attn_norm"
    replicated = d * h * (norm in offloaded)  # the norm's input
    recompute_norm = "layernorm" in recomputed and not te_layers
    replicated += i * h * bool(recompute_norm or "qkv_linear" in offloaded)
    split = d * (query + key_value) / tp * ("core_attn" in offloaded)  # Q, K, V
    if q is not None:  # quantized, the projection's input is two tensors: core attention's
        split += d * query / tp * ("core_attn" in offloaded)  # output, and
    split += i * query / tp * ("attn_proj" in offloaded)  # the projection's saved input
    return LayerTerms(split=split, replicated=replicated, scores=0.0)


def _mlp_dropped(m: Any, d: int, layout: Any, recomputed: set[str],
                 offloaded: set[str], q: float | None, te_layers: bool) -> LayerTerms:
    h, gate = m.hidden_size, 2 if m.activation == "swiglu" else 1
    i = d if q is None else q  # a TE linear's saved input
    norm_out = d if m.num_moe_experts else i  # a dense MLP's fc1 input; the MoE router's input
    apart = bool(m.num_moe_experts) or not te_layers  # a dense MLP's TE FC1 holds its norm
    replicated = apart * (d * h * ("mlp_norm" in offloaded)
                          + norm_out * h * ("layernorm" in recomputed))
    if not m.num_moe_experts:
        inner = (d * m.ffn_hidden_size * gate + i * m.ffn_hidden_size) / layout.tensor
        # TE's FC1 holds the norm, so `mlp`'s checkpoint starts at the norm's input and drops
        # FC1's input (the norm's output) too (transformer_layer.py:882-898)
        replicated += i * h * ("mlp" in recomputed and te_layers)
        return LayerTerms(split=inner * ("mlp" in recomputed), replicated=replicated,
                          scores=0.0)
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    topk, etp = m.moe_router_topk, layout.expert_tensor_size
    x = m.moe_latent_size or h  # the width routed copies have (`_mlp_terms`)
    if "moe" in recomputed:  # the whole MoE layer: only its input is kept
        routed = topk * (i * x + (d * ffn * gate + i * ffn) / etp + d * x)
        latent = i * (h + x) if m.moe_latent_size else 0  # the latent projections' inputs
        return LayerTerms(split=routed / layout.tensor,
                          replicated=replicated + 4 * m.num_moe_experts + latent, scores=0.0)
    routed = topk * i * ffn / etp * ("moe_act" in recomputed)  # the activation's output
    routed += topk * d * ffn * gate / etp * ("moe_act" in offloaded)  # its input
    routed += topk * i * x * ("expert_fc1" in offloaded)  # the experts' input
    return LayerTerms(split=routed / layout.tensor, replicated=replicated, scores=0.0)


def fused_norms(cfg: Any, on_gpu: bool) -> bool:
    """Whether the ranks build Transformer Engine's layers, which fuse the attention norm into
    the QKV projection and a dense MLP's norm into FC1 (`TELayerNormColumnParallelLinear`; the
    layer's `input_layernorm` and a dense layer's `pre_mlp_layernorm` are `IdentityOp`:
    models/gpt/gpt_layer_specs.py:138-157, models/hybrid/hybrid_layer_specs.py:122-135,
    197-213). There `layernorm` recompute and `attn_norm` / `mlp_norm` offloading reach only an
    MoE layer's own pre-MLP norm (transformer/transformer_layer.py:450-456, 1439-1450), and
    offloading `qkv_linear` moves the norm's input the fused linear saves beside its own
    (Transformer Engine's `_LayerNormLinear` marks both, module/layernorm_linear.py:489-490).
    Megatron's local layers (CPU ranks) keep every norm a module of its own."""
    return uses_transformer_engine(cfg.model.transformer_impl, on_gpu)


def dropped_per_token(cfg: Any, symbol: str | None = None,
                      recompute: str | None = None, low: bool = True,
                      te_layers: bool = True) -> LayerTerms:
    """Bytes per token one layer (of kind `symbol`; a GPT layer: attention and its MLP or MoE)
    no longer keeps on the GPU: selective recompute's modules and activation offloading's, the
    scores apart (`layer_bytes` drops them for core_attn), each at the size the layer holds it
    (`low`: quantized where a linear saves its input quantized; `te_layers`: the norms fused,
    `fused_norms`)."""
    m, layout = cfg.model, cfg.layout
    d, q = _ACT_BYTES[cfg.precision.dtype], saved_input_bytes(cfg, low)
    recomputed, offloaded = _recomputed(cfg, recompute), set(cfg.train.offload_modules)
    if not recomputed and not offloaded:
        return LayerTerms(0.0, 0.0, 0.0)
    symbols = kinds.gpt_layer_kinds(m) if symbol is None else (symbol,)
    split = replicated = 0.0
    for kind in symbols:
        if kind == kinds.ATTENTION:
            part = _attention_dropped(m, d, layout.tensor, recomputed, offloaded, q, te_layers)
        elif kind == kinds.MLP:
            part = _mlp_dropped(dataclasses.replace(m, num_moe_experts=None), d, layout,
                                recomputed, offloaded, q, te_layers)
        elif kind == kinds.MOE:
            part = _mlp_dropped(m, d, layout, recomputed, offloaded, q, te_layers)
        else:
            continue  # a Mamba layer: neither recomputed by module nor offloaded
        split, replicated = split + part.split, replicated + part.replicated
    return LayerTerms(split=split, replicated=replicated, scores=0.0)


def layer_bytes(cfg: Any, attention: Attention, recompute: str | None = None,
                symbol: str | None = None, low: bool = True, te_layers: bool = True) -> float:
    """Bytes one layer (of a hybrid model: of kind `symbol`) keeps for one micro-batch on one
    rank (no recompute, or selective by module), less what activation offloading moves to
    host memory; `low`: a layer of the plugin's FP8/FP4 region (False: a BF16 end layer);
    `te_layers`: Transformer Engine's layers, whose norms are fused (`fused_norms`)."""
    layout, t = cfg.layout, cfg.train
    terms = (layer_bytes_per_token(cfg, attention, low) if symbol is None
             else symbol_bytes_per_token(cfg, symbol, attention, low))
    dropped = dropped_per_token(cfg, symbol, recompute, low, te_layers)
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


def logits_bytes(cfg: Any) -> float:
    """One head's logits for one micro-batch on one rank of the last stage, as its loss keeps
    them: tokens x padded vocabulary / TP in FP32. Megatron's vocabulary-parallel cross entropy
    (the fused one the project runs on GPUs, `cross_entropy_loss_fusion` with the native
    implementation, and the unfused one on CPU alike; `calculate_per_token_loss` changes only
    how the per-token losses are summed) casts the output layer's logits to FP32
    (`VocabParallelCrossEntropy.calculate_logits_max`, `tensor_parallel/cross_entropy.py:25`),
    takes their softmax in place and saves it for the backward (:42-77, 181;
    `fusions/fused_cross_entropy.py:93-119`). The BF16 logits it cast are `cast_logits_bytes`."""
    layout = cfg.layout
    return _tokens(cfg) * 4 * layout.padded_vocab / layout.tensor


def cast_logits_bytes(cfg: Any) -> float:
    """The main head's logits in the run's dtype, held beside the FP32 copy its loss makes, for
    one micro-batch on one rank of the last stage: tokens x padded vocabulary / TP x 2 bytes.
    The model's forward holds `logits` while `compute_language_model_loss` runs
    (`models/hybrid/hybrid_model.py:613-631`, `models/gpt/gpt_model.py:762-794`) and the loss's
    `.float()` makes the FP32 copy (`tensor_parallel/cross_entropy.py:25`), fused or not; its
    backward makes the BF16 gradient beside the FP32 softmax again (the fused one's
    `.to(torch.bfloat16)`, `fusions/fused_cross_entropy.py:82`; unfused, autograd casts the
    FP32 gradient to the input's dtype). One head's alone: an MTP depth's BF16 logits are freed
    when `process_mtp_loss` returns, before the main head's are made
    (`transformer/multi_token_prediction.py:840-894`), while every depth's FP32 softmax stays
    for the backward (`mtp_logits_bytes`). 0 for FP32 runs, whose `.float()` copies nothing."""
    d = _ACT_BYTES[cfg.precision.dtype]
    if d >= 4:
        return 0.0
    return _tokens(cfg) * d * cfg.layout.padded_vocab / cfg.layout.tensor


def output_bytes(cfg: Any) -> float:
    """One head on the last stage, one micro-batch: final-norm and output-layer inputs, and the
    FP32 logits the vocabulary-parallel cross entropy keeps (`logits_bytes`; the vocabulary is
    split over TP). The main head's BF16 logits come beside it (`cast_logits_bytes`)."""
    d = _ACT_BYTES[cfg.precision.dtype]
    split = cfg.layout.tensor if cfg.layout.sequence_parallel else 1
    return _tokens(cfg) * 2 * d * cfg.model.hidden_size / split + logits_bytes(cfg)


def mtp_logits_bytes(cfg: Any) -> float:
    """Of a hybrid model's MTP block on the last stage (`mtp_bytes`), its depths' FP32 logits:
    each depth computes its own through the output layer and keeps them for its loss
    (`transformer/multi_token_prediction.py`, `process_mtp_loss`), whatever the recompute."""
    m = cfg.model
    depths = hybrid.mtp_depths(m.hybrid_layer_pattern) if m.is_hybrid else 0
    return depths * logits_bytes(cfg)


def _stage_layer_bytes(cfg: Any, attention: Attention, layers: list[int],
                       te_layers: bool) -> list[tuple[float, float]]:
    """Per stage (holding `layers` layers), (mean, largest) bytes of one of its layers for one
    micro-batch: every GPT layer alike, a hybrid model's by kind; with a plugin that quantizes
    the linears' saved inputs, by kind and by whether the layer is in its FP8/FP4 region."""
    kept = cfg.plugins.gemm_inputs(cfg)
    if kept is not None:
        found = []
        for stage, count in zip(stage_layer_numbers(cfg), layers, strict=True):
            keys = [(symbol, in_low_precision(cfg, number, kept)) for number, symbol in stage]
            sizes = {key: layer_bytes(cfg, attention, symbol=key[0], low=key[1],
                                      te_layers=te_layers) for key in set(keys)}
            found.append((sum(sizes[key] for key in keys) / max(count, 1),
                          max(sizes.values(), default=0.0)))
        return found
    if not cfg.model.is_hybrid:
        full = layer_bytes(cfg, attention, te_layers=te_layers)
        return [(full, full)] * len(layers)
    found = []
    for counts, count in zip(stage_kinds(cfg), layers, strict=True):
        sizes = {symbol: layer_bytes(cfg, attention, symbol=symbol, te_layers=te_layers)
                 for symbol, n in counts.items() if n}
        total = sum(counts[symbol] * size for symbol, size in sizes.items())
        found.append((total / max(count, 1), max(sizes.values(), default=0.0)))
    return found


def mtp_bytes(cfg: Any, attention: Attention, te_layers: bool = True) -> tuple[float, float]:
    """A hybrid model's MTP block for one micro-batch on one rank of the last stage: (what it
    keeps of its layers and projections, its output-layer inputs and logits).

    Without recompute (or selective, which drops the same modules in an MTP depth's layers as
    in the decoder's: they are the same layer classes on the same config) each depth keeps its
    layers' terms, the inputs of the embedding and hidden-state norms and of the 2·hidden-wide
    projection, its final norm's input, and an output-layer input and FP32 logits like the main
    head's (`transformer/multi_token_prediction.py:1128-1153, 1227-1239, 840-861`).

    Under full recompute (method uniform, the only one run here; Megatron's block method would
    warn and run MTP unrecomputed, :1424-1444) a depth runs whole inside one checkpoint
    (:1499-1500, 1415-1423; `_proj_and_transformer_layer`, :1155-1225: the norms, the
    projection, the depth's layers and its final norm), which saves only its positional tensor
    inputs (`tensor_parallel/random.py:606-618`): the depth's input hidden states and its token
    embeddings, each tokens x hidden / TP under sequence parallel (the mask and the rotary
    table are the decoder's). Its output is copied into the concatenation whose chunk the
    output layer keeps as its input (:1845-1848), beside the logits; the rebuild is
    `mtp_rebuild_bytes`."""
    m = cfg.model
    depths = hybrid.mtp_depths(m.hybrid_layer_pattern) if m.is_hybrid else 0
    if not depths:
        return 0.0, 0.0
    hidden = _hidden_bytes(cfg)
    if cfg.train.recompute == "full":  # the final norm's input is rebuilt, not kept
        return depths * 2 * hidden, depths * (output_bytes(cfg) - hidden)
    layers = sum(layer_bytes(cfg, attention, symbol=symbol, low=False, te_layers=te_layers)
                 for symbol in hybrid.mtp_pattern(m.hybrid_layer_pattern))
    return depths * (layers + 4 * hidden), depths * output_bytes(cfg)


def mtp_rebuild_bytes(cfg: Any, attention: Attention, te_layers: bool = True) -> float:
    """Full recompute: what one MTP depth holds while the backward rebuilds it (one depth at a
    time, as `CheckpointFunction.backward` reruns its forward, `tensor_parallel/random.py:
    625-647`): its projection's 2·hidden-wide input, and, since its layers are a HybridStack
    that checkpoints each layer again under the same settings (`models/hybrid/hybrid_block.py:
    348-359`; one layer a block, `recompute_num_layers` 1 as Megatron asserts for MTP), one
    input per layer and the final norm's input, beside the largest of its layers rebuilt in
    full. The norms' inputs are the checkpoint's own. 0 without full recompute or MTP."""
    m = cfg.model
    depths = hybrid.mtp_depths(m.hybrid_layer_pattern) if m.is_hybrid else 0
    if not depths or cfg.train.recompute != "full":
        return 0.0
    symbols = hybrid.mtp_pattern(m.hybrid_layer_pattern)
    largest = max(layer_bytes(cfg, attention, symbol=symbol, low=False, te_layers=te_layers)
                  for symbol in symbols)
    return (2 + len(symbols) + 1) * _hidden_bytes(cfg) + largest


def _hidden_bytes(cfg: Any) -> float:
    """One micro-batch's hidden states on one rank: tokens x hidden, split by TP under SP."""
    split = cfg.layout.tensor if cfg.layout.sequence_parallel else 1
    return _tokens(cfg) * _ACT_BYTES[cfg.precision.dtype] * cfg.model.hidden_size / split


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes on one rank of one pipeline stage at its peak."""

    stage: int
    layers: int
    in_flight: float  # micro-batches' worth of the stage's layers held
    per_layer: float  # one layer, one micro-batch (what recompute leaves kept)
    layers_total: float
    embedding: float
    output: float  # the main head: its inputs, FP32 logits and the BF16 ones they are cast from
    recompute_working: float  # full recompute: one decoder block rebuilt in backward
    cuda_graphs: float = 0.0  # CUDA graphs' static buffers
    mtp: float = 0.0  # the last stage's MTP depths: their layers in flight, logits and loss
    mtp_rebuild: float = 0.0  # full recompute: one MTP depth rebuilt in backward

    @property
    def heads(self) -> float:
        """The heads' phase of the backward: both heads' memory and an MTP depth rebuilt."""
        return self.output + self.mtp + self.mtp_rebuild

    @property
    def total(self) -> float:
        """The decoder's output (its final norm runs after the checkpointed blocks,
        `transformer/transformer_block.py:625-694`, `models/hybrid/hybrid_block.py:347-394`)
        feeds every head (`GPTModel._postprocess`, `models/gpt/gpt_model.py:666-794`;
        `HybridModel.forward`, `models/hybrid/hybrid_model.py:515-633`), so autograd runs the
        heads' backward (loss, output layer, final norm; each MTP depth's loss, output layer,
        layers and projection) before any decoder block's. The schedule keeps no graph
        (`pipeline_parallel/schedules.py:199-226`): a node frees its saved tensors once run, and
        the vocabulary-parallel cross entropy turns its saved softmax into the logits' gradient
        in place (`_VocabParallelCrossEntropy.backward`, `tensor_parallel/cross_entropy.py:
        186-210`; :82-116). So when `CheckpointFunction.backward` (`tensor_parallel/random.py:
        625-660`) rebuilds the decoder's last block, the heads' logits and inputs are gone. An
        MTP depth's rebuild may run while another head's logits are held (their order is
        autograd's), so it is counted with them. Off the last stage, or without full recompute,
        one phase is 0."""
        return (self.layers_total + self.embedding + self.cuda_graphs
                + max(self.recompute_working, self.heads))


def recompute_inputs_kept(chunks: list[int], block: int) -> int:
    """Block inputs full recompute keeps per micro-batch on a stage whose model chunks hold
    `chunks` layers: Megatron Core's uniform method (the one the project runs) checkpoints
    each chunk in blocks of `block` layers and cuts the last one short
    (`megatron/core/recompute.py`: `min(layer_idx + recompute_num_layers,
    num_layers_per_pipeline_rank)`), so a chunk keeps ceil(layers / block) inputs, not
    layers / block: 3 for 8 layers in blocks of 3 (3, 3, 2), 1 for 8 in blocks of 100."""
    return sum(-(-layers // block) for layers in chunks)


def stage_activations(cfg: Any, attention: Attention,
                      te_layers: bool) -> list[StageActivations]:
    """Each stage's activations at its peak (the first stage holds the most micro-batches), on
    Transformer Engine's layers or Megatron's local ones (`te_layers`, `fused_norms`)."""
    layout, t = cfg.layout, cfg.train
    stages = stage_layer_counts(cfg)
    block = t.recompute_num_layers
    result = []
    per_stage = _stage_layer_bytes(cfg, attention, [sum(chunks) for chunks in stages],
                                   te_layers)
    counts = stage_kinds(cfg) if cfg.model.is_hybrid else [None] * len(stages)
    for stage, (chunks, (full, largest)) in enumerate(zip(stages, per_stage, strict=True)):
        layers = sum(chunks)
        flight = layer_microbatches_in_flight(stage, layout.pipeline, layout.virtual_stages,
                                              layout.microbatches)
        if t.recompute == "full":
            kept = recompute_inputs_kept(chunks, block)
            per_layer = checkpoint_bytes(cfg) * kept / max(layers, 1)  # the stage's mean
            working = largest * min(block, max(chunks))
        else:
            per_layer, working = full, 0.0
        embedding = embedding_bytes(cfg) * flight if stage == 0 else 0.0
        last = stage == len(stages) - 1
        output = output_bytes(cfg) + cast_logits_bytes(cfg) if last else 0.0
        graphs = cuda_graph_static_bytes(cfg, counts[stage], layers)
        mtp_layers, mtp_logits = mtp_bytes(cfg, attention, te_layers) if last else (0.0, 0.0)
        rebuild = mtp_rebuild_bytes(cfg, attention, te_layers) if last else 0.0
        result.append(StageActivations(stage, layers, flight, per_layer,
                                       per_layer * layers * flight, embedding, output, working,
                                       graphs, mtp_layers * flight + mtp_logits, rebuild))
    return result

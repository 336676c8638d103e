"""Parameters each rank holds, counted from the model shape exactly as Megatron Core builds it.

Memory is bytes per parameter times parameters, so the count must be exact, not 12·L·h². A
hybrid model's layers are counted by kind (Mamba2 mixer, attention, MLP, MoE) from the symbols
each model chunk holds (`Layout.chunk_patterns`).
Weights split over TP (QKV, projection, MLP, embedding, output layer), weights every TP rank
holds a full copy of (norms, row-parallel biases, the MoE router, learned positions) and expert
weights (split over EP and expert-TP) are kept apart: they shard differently over data
parallel and they are counted differently by the dry run, which counts a replicated weight
once (`tests/unit/test_plan_params.py` compares both with the real model on the meta device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.config import hybrid


@dataclass(frozen=True)
class ParamCount:
    """Parameters on one rank, by how they are split."""

    tp_split: int = 0  # split over TP: each TP rank holds its own slice
    replicated: int = 0  # a full copy on every TP rank (norms, row-parallel biases, router)
    expert: int = 0  # expert weights: split over EP and expert-TP, sharded over expert-DP
    tied_copy: int = 0  # the last stage's copy of a tied input embedding (inside tp_split)

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(self.tp_split + other.tp_split, self.replicated + other.replicated,
                          self.expert + other.expert, self.tied_copy + other.tied_copy)

    def scale(self, n: int) -> ParamCount:
        return ParamCount(self.tp_split * n, self.replicated * n, self.expert * n,
                          self.tied_copy * n)

    @property
    def dense(self) -> int:
        return self.tp_split + self.replicated

    @property
    def total(self) -> int:
        """Every parameter tensor element this rank allocates."""
        return self.dense + self.expert

    def distinct(self, tp_rank: int) -> int:
        """What this rank adds to the whole model, each weight once (the dry run's count)."""
        replicated = self.replicated if tp_rank == 0 else 0
        return self.tp_split - self.tied_copy + replicated + self.expert


def stage_layer_counts(cfg: Any) -> list[list[int]]:
    """Layers per pipeline stage, per virtual chunk, as Megatron assigns them (the layout
    object owns the split: uneven first/last stages, a hybrid model's `|` segments)."""
    return cfg.layout.chunk_layers()


def _attention(m: Any, tp: int) -> ParamCount:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value, h = heads * width, 2 * groups * width, m.hidden_size
    bias = int(m.add_bias_linear)
    split = ((query + key_value) * h + (query + key_value) * bias + h * query) // tp
    return ParamCount(tp_split=split, replicated=h * bias + _norm(m))


def _norm(m: Any) -> int:
    return m.hidden_size * (2 if m.normalization == "LayerNorm" else 1)


def _mlp_width(m: Any, ffn: int) -> int:
    """Rows of the first MLP weight: gated units (SwiGLU) stack two projections."""
    return ffn * (2 if m.activation == "swiglu" else 1)


def _dense_mlp(m: Any, tp: int) -> ParamCount:
    h, f, bias = m.hidden_size, m.ffn_hidden_size, int(m.add_bias_linear)
    fc1 = _mlp_width(m, f) * (h + bias)
    split = (fc1 + h * f) // tp
    return ParamCount(tp_split=split, replicated=h * bias + _norm(m))


def _moe_mlp(m: Any, layout: Any) -> ParamCount:
    """Router (its expert bias is a buffer, not a parameter), the routed experts (split over
    EP and expert-TP) and the shared experts (a dense MLP split over TP)."""
    h, f = m.hidden_size, m.moe_ffn_hidden_size or m.ffn_hidden_size
    local_experts = m.num_moe_experts // layout.expert
    per_expert = (_mlp_width(m, f) * h + h * f) // layout.expert_tensor_size
    router = m.num_moe_experts * h
    shared = m.moe_shared_expert_ffn_hidden_size or 0
    shared_split = (_mlp_width(m, shared) * h + h * shared) // layout.tensor
    return ParamCount(tp_split=shared_split, replicated=router + _norm(m),
                      expert=local_experts * per_expert)


def _mamba(m: Any, tp: int) -> ParamCount:
    """A Mamba2 layer (`ssm/mamba_mixer.py:276-443`): in_proj to z, x, B, C and dt, the
    depthwise conv over x, B, C (weight and bias), dt_bias, A_log and D per head, the gated
    norm over d_inner, out_proj; all split over TP. The layer's input norm is replicated."""
    h, heads = m.hidden_size, hybrid.mamba_heads(m)
    inner, bc = heads * m.mamba_head_dim, 2 * m.mamba_num_groups * m.mamba_state_dim
    in_proj = h * (2 * inner + bc + heads)
    conv = (inner + bc) * (m.mamba_conv_kernel + 1)
    split = in_proj + conv + 3 * heads + inner + inner * h
    return ParamCount(tp_split=split // tp, replicated=_norm(m))


def symbol_params(cfg: Any, symbol: str) -> ParamCount:
    """One hybrid layer of kind `symbol` on one rank."""
    m, layout = cfg.model, cfg.layout
    if symbol == hybrid.MAMBA:
        return _mamba(m, layout.tensor)
    if symbol == hybrid.ATTENTION:
        return _attention(m, layout.tensor)
    if symbol == hybrid.MLP:
        return _dense_mlp(m, layout.tensor)
    return _moe_mlp(m, layout)


def stage_kinds(cfg: Any) -> list[dict[str, int]]:
    """Layers of each kind (attention `*`, MLP `-`, MoE `E`, Mamba2 `M`) on each pipeline
    stage: a GPT layer is an attention and an MLP (or MoE) sublayer."""
    if cfg.model.is_hybrid:
        return [{symbol: "".join(stage).count(symbol) for symbol in hybrid.LAYER_SYMBOLS}
                for stage in cfg.layout.chunk_patterns()]
    mlp = hybrid.MOE if cfg.model.num_moe_experts else hybrid.MLP
    return [{hybrid.ATTENTION: count, mlp: count} for count in cfg.layout.stage_layers()]


def layer_params(cfg: Any) -> ParamCount:
    """One transformer layer of a GPT model on one rank (every rank of a stage holds the same
    sizes)."""
    m, layout = cfg.model, cfg.layout
    mlp = _moe_mlp(m, layout) if m.num_moe_experts else _dense_mlp(m, layout.tensor)
    return _attention(m, layout.tensor) + mlp


def _stage_layers(cfg: Any) -> list[ParamCount]:
    """All layers of each pipeline stage on one of its ranks (every chunk together)."""
    if cfg.model.is_hybrid:
        return [sum((symbol_params(cfg, symbol) for chunk in stage for symbol in chunk),
                    ParamCount()) for stage in cfg.layout.chunk_patterns()]
    layer = layer_params(cfg)
    return [layer.scale(sum(chunks)) for chunks in stage_layer_counts(cfg)]


def embedding_params(cfg: Any) -> ParamCount:
    """Input embedding (first chunk of the first stage): vocabulary split over TP."""
    m, layout = cfg.model, cfg.layout
    words = layout.padded_vocab * m.hidden_size // layout.tensor
    positions = m.seq_length * m.hidden_size if m.position_embedding == "learned_absolute" else 0
    return ParamCount(tp_split=words, replicated=positions)


def output_params(cfg: Any) -> ParamCount:
    """Final norm and output layer (last chunk of the last stage). Tied weights need no output
    layer on a single stage; with pipelining the last stage holds a copy of the embedding."""
    m, layout = cfg.model, cfg.layout
    logits = layout.padded_vocab * m.hidden_size // layout.tensor
    tied = m.share_embeddings_and_output_weights
    if tied and layout.pipeline == 1:
        return ParamCount(replicated=_norm(m))
    return ParamCount(tp_split=logits, replicated=_norm(m), tied_copy=logits if tied else 0)


def stage_params(cfg: Any) -> list[ParamCount]:
    """Parameters held by any one rank of each pipeline stage (all chunks together)."""
    stages = _stage_layers(cfg)
    counts = []
    for stage, count in enumerate(stages):
        if stage == 0:
            count = count + embedding_params(cfg)
        if stage == len(stages) - 1:
            count = count + output_params(cfg)
        counts.append(count)
    return counts


def model_parameters(cfg: Any) -> int:
    """Whole-model parameters, each weight once (the dry run's 'model parameters')."""
    layout = cfg.layout
    total = 0
    for count in stage_params(cfg):
        dense = count.tp_split - count.tied_copy
        total += dense * layout.tensor + count.replicated + count.expert * (
            layout.expert * layout.expert_tensor_size)
    return total


def active_parameters(cfg: Any) -> int:
    """Parameters one token runs through: the whole model but, in every MoE layer, only its
    top-k routed experts (shared experts, routers, embedding and output all count)."""
    m = cfg.model
    total = model_parameters(cfg)
    if m.num_moe_experts is None:
        return total
    width = m.moe_ffn_hidden_size or m.ffn_hidden_size
    per_expert = _mlp_width(m, width) * m.hidden_size + m.hidden_size * width
    moe_layers = hybrid.count(m, hybrid.MOE) if m.is_hybrid else m.num_layers
    return total - moe_layers * (m.num_moe_experts - m.moe_router_topk) * per_expert

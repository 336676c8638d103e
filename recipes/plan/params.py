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

from typing import Any

from recipes.models import kinds
from recipes.models.counts import ParamCount
from recipes.models.gpt.params import (
    attention_params,
    dense_mlp_params,
    embedding_params,
    output_params,
)
from recipes.models.hybrid import pattern as hybrid
from recipes.models.hybrid.params import mamba_params, mtp_layer_params
from recipes.models.moe.params import moe_mlp_params, routed_expert_params


def stage_layer_counts(cfg: Any) -> list[list[int]]:
    """Layers per pipeline stage, per virtual chunk, as Megatron assigns them (the layout
    object owns the split: uneven first/last stages, a hybrid model's `|` segments)."""
    return cfg.layout.chunk_layers()


def symbol_params(cfg: Any, symbol: str) -> ParamCount:
    """One hybrid layer of kind `symbol` on one rank."""
    m, layout = cfg.model, cfg.layout
    if symbol == kinds.MAMBA:
        return mamba_params(m, layout.tensor)
    if symbol == kinds.ATTENTION:
        return attention_params(m, layout.tensor)
    if symbol == kinds.MLP:
        return dense_mlp_params(m, layout.tensor)
    return moe_mlp_params(m, layout)


def stage_kinds(cfg: Any) -> list[dict[str, int]]:
    """Layers of each kind (attention `*`, MLP `-`, MoE `E`, Mamba2 `M`) on each pipeline
    stage: a GPT layer is an attention and an MLP (or MoE) sublayer."""
    if cfg.model.is_hybrid:
        return [{symbol: "".join(stage).count(symbol) for symbol in kinds.LAYER_SYMBOLS}
                for stage in cfg.layout.chunk_patterns()]
    return [dict.fromkeys(kinds.gpt_layer_kinds(cfg.model), count)
            for count in cfg.layout.stage_layers()]


def layer_params(cfg: Any) -> ParamCount:
    """One transformer layer of a GPT model on one rank (every rank of a stage holds the same
    sizes)."""
    m, layout = cfg.model, cfg.layout
    mlp = moe_mlp_params(m, layout) if m.num_moe_experts else dense_mlp_params(m, layout.tensor)
    return attention_params(m, layout.tensor) + mlp


def _stage_layers(cfg: Any) -> list[ParamCount]:
    """All layers of each pipeline stage on one of its ranks (every chunk together)."""
    if cfg.model.is_hybrid:
        return [sum((symbol_params(cfg, symbol) for chunk in stage for symbol in chunk),
                    ParamCount()) for stage in cfg.layout.chunk_patterns()]
    layer = layer_params(cfg)
    return [layer.scale(sum(chunks)) for chunks in stage_layer_counts(cfg)]


def mtp_params(cfg: Any) -> ParamCount:
    """The MTP block on one rank of the last stage: every depth that holds weights of its own
    (one when the depths share a layer), its inner layers by kind, and the copy of the input
    embedding the block reads when the last stage is not the first (`models/hybrid/
    hybrid_model.py:231-239`; kept equal to the first stage's, so a copy)."""
    m, layout = cfg.model, cfg.layout
    built = hybrid.mtp_built(m) if m.is_hybrid else 0
    if not built:
        return ParamCount()
    depth = mtp_layer_params(m, layout.tensor)
    depth = sum((symbol_params(cfg, symbol)
                 for symbol in hybrid.mtp_pattern(m.hybrid_layer_pattern)), depth)
    count = depth.scale(built)
    if layout.pipeline > 1:
        words = embedding_params(cfg).tp_split
        count = count + ParamCount(tp_split=words, tied_copy=words)
    return count


def stage_params(cfg: Any) -> list[ParamCount]:
    """Parameters held by any one rank of each pipeline stage (all chunks together)."""
    stages = _stage_layers(cfg)
    counts = []
    for stage, count in enumerate(stages):
        if stage == 0:
            count = count + embedding_params(cfg)
        if stage == len(stages) - 1:
            count = count + output_params(cfg) + mtp_params(cfg)
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


def moe_layers_built(m: Any) -> int:
    """MoE layers that hold weights: the decoder's and those of the MTP depths built."""
    if not m.is_hybrid:
        return m.num_layers
    mtp = hybrid.mtp_pattern(m.hybrid_layer_pattern).count(kinds.MOE) * hybrid.mtp_built(m)
    return hybrid.count(m, kinds.MOE) + mtp


def active_parameters(cfg: Any) -> int:
    """Parameters one token runs through: the whole model (MTP depths included) but, in every
    MoE layer, only its top-k routed experts (shared experts, routers, latent projections,
    embedding and output all count)."""
    m = cfg.model
    total = model_parameters(cfg)
    if m.num_moe_experts is None:
        return total
    unused = m.num_moe_experts - m.moe_router_topk
    return total - moe_layers_built(m) * unused * routed_expert_params(m)

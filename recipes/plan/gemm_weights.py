"""GEMM weights a plugin stores in another format than the run's dtype (FP8 parameters), per rank.

With FP8 parameters (`plugins.fp8.param_gather`) every layer outside the BF16 ends is built under
Transformer Engine's `fp8_model_init` (`fp8_utils.py:774-823`): its linears' weights exist in FP8
only, one byte each, with no BF16 copy (the distributed optimizer's fp32 shard is the master),
and the data-parallel all-gather moves those bytes. Biases, norms, the Mamba mixer's conv, dt, A
and D, the MoE router, the embedding and the output layer are not TE linears and keep the run's
dtype, as do the end layers (`is_first_last_bf16_layer`, `fp8_utils.py:673-689`, compares the
global layer number; a hybrid model's layers are its pattern symbols). Transformer Engine's
transposed FP8 copies of weights for the backward GEMMs are not counted, with or without FP8
parameters, as the planner counts no TE workspace.
"""

from __future__ import annotations

from typing import Any

from recipes.models import kinds
from recipes.models.counts import ParamCount
from recipes.models.gpt.params import attention_gemm_weights, dense_mlp_gemm_weights
from recipes.models.hybrid.params import mamba_gemm_weights
from recipes.models.moe.params import moe_gemm_weights


def _layer_gemm_weights(cfg: Any, symbol: str | None) -> ParamCount:
    """One layer's GEMM weights on one rank: a hybrid layer of kind `symbol`, or (None) a GPT
    transformer layer (attention and its MLP or MoE)."""
    m, layout = cfg.model, cfg.layout
    mlp = (lambda: moe_gemm_weights(m, layout)) if m.num_moe_experts else (
        lambda: dense_mlp_gemm_weights(m, layout.tensor))
    if symbol is None:
        return attention_gemm_weights(m, layout.tensor) + mlp()
    return {kinds.MAMBA: lambda: mamba_gemm_weights(m, layout.tensor),
            kinds.ATTENTION: lambda: attention_gemm_weights(m, layout.tensor),
            kinds.MLP: lambda: dense_mlp_gemm_weights(m, layout.tensor),
            kinds.MOE: lambda: moe_gemm_weights(m, layout)}[symbol]()


def stage_layer_numbers(cfg: Any) -> list[list[tuple[int, str | None]]]:
    """(global 0-based layer number, hybrid symbol or None) of every layer on each pipeline
    stage. Megatron numbers model chunks virtual stage first: chunk v of stage p follows every
    chunk of the earlier virtual stages and of the earlier stages of its own."""
    layout = cfg.layout
    hybrid = cfg.model.is_hybrid
    chunks = layout.chunk_patterns() if hybrid else [
        [[None] * count for count in stage] for stage in layout.chunk_layers()]
    numbers: list[list[tuple[int, str | None]]] = [[] for _ in chunks]
    start = 0
    for virtual in range(layout.virtual_stages):
        for stage, stage_chunks in enumerate(chunks):
            for offset, symbol in enumerate(stage_chunks[virtual]):
                numbers[stage].append((start + offset, symbol))
            start += len(stage_chunks[virtual])
    return numbers


def in_low_precision(cfg: Any, number: int, kept: Any) -> bool:
    """Whether global layer `number` (0-based) lies outside the ends `kept` keeps in the run's
    dtype (a plugin's `KeptEnds`: its `GemmWeights` or `GemmInputs`), as Megatron's
    `is_first_last_bf16_layer` decides (`fp8_utils.py:673-689`)."""
    return kept.first_layers_kept <= number < cfg.model.num_layers - kept.last_layers_kept


def stage_low_precision_weights(cfg: Any) -> list[ParamCount]:
    """Per pipeline stage, the GEMM weights one rank holds in the plugin's format (all zero
    when no plugin stores them so)."""
    stored = cfg.plugins.gemm_weights(cfg)
    if stored is None:
        return [ParamCount() for _ in range(cfg.layout.pipeline)]
    return [sum((_layer_gemm_weights(cfg, symbol) for number, symbol in stage
                 if in_low_precision(cfg, number, stored)), ParamCount())
            for stage in stage_layer_numbers(cfg)]


def weight_bytes_saved(cfg: Any, low: ParamCount, dtype_bytes: int,
                       weights_sharded: bool) -> float:
    """Bytes one rank saves by holding `low` in the plugin's format instead of `dtype_bytes`
    (dense weights shard over DP x CP, experts over expert-DP, when the weights shard)."""
    stored = cfg.plugins.gemm_weights(cfg)
    if stored is None:
        return 0.0
    layout = cfg.layout
    dense = low.dense / (layout.data_parallel * layout.context if weights_sharded else 1)
    expert = low.expert / (layout.expert_data_parallel if weights_sharded else 1)
    return max(0, dtype_bytes - stored.bytes_per_weight) * (dense + expert)

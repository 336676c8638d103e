"""The GPT family's FLOPs terms, forward, per token (or per attended pair): Q/K/V and output
projections, the attention scores, the dense MLP, the logits. `s` is the planner's `FlopsShape`
(`recipes/plan/flops.py`, the one definition that sums these terms over a model's layers).
"""

from __future__ import annotations

from typing import Any


def qkv_projection_flops(s: Any) -> float:
    """Forward FLOPs per token of one attention layer's Q, K and V projections."""
    query, key_value = s.num_attention_heads * s.kv_channels, s.num_query_groups * s.kv_channels
    return 2 * s.hidden_size * (query + 2 * key_value)


def output_projection_flops(s: Any) -> float:
    """Forward FLOPs per token of one attention layer's output projection."""
    return 2 * s.num_attention_heads * s.kv_channels * s.hidden_size


def attention_projection_flops(s: Any) -> float:
    """Forward FLOPs per token of one attention layer's Q, K, V and output projections."""
    return qkv_projection_flops(s) + output_projection_flops(s)


def logits_flops(s: Any) -> float:
    """Forward FLOPs per token of the output layer over the padded vocabulary."""
    return 2 * s.hidden_size * s.padded_vocab_size


def attention_score_flops(s: Any, pairs: float) -> float:
    """Forward FLOPs of every attention layer's QK^T and softmax(QK^T)V over `pairs` (query,
    key) pairs: 2 · 2 · query width per pair. A causal row of n tokens has n²/2 of them."""
    return s.attention_layers * 2 * 2 * s.num_attention_heads * s.kv_channels * pairs


def mlp_flops(s: Any, width: int) -> float:
    """Forward FLOPs per token of an MLP of inner `width` (two matrices, three when gated)."""
    return 2 * s.hidden_size * width * (3 if s.gated else 2)

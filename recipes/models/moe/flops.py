"""The MoE family's FLOPs term: one MoE layer's forward per token, the top-k routed experts a
token runs (not all of them) and the shared experts; the router is not counted, as in
Megatron-LM's `num_floating_point_operations`."""

from __future__ import annotations

from typing import Any

from recipes.models.gpt.flops import mlp_flops


def moe_flops(s: Any) -> float:
    """Forward FLOPs per token of one MoE layer: the top-k routed experts and the shared ones."""
    return mlp_flops(s, s.moe_router_topk * s.moe_ffn_hidden_size + s.moe_shared_ffn_hidden_size)

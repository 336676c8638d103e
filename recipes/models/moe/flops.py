"""The MoE family's FLOPs term: one MoE layer's forward per token, the top-k routed experts a
token runs (not all of them) and the shared experts; the router is not counted, as in
Megatron-LM's `num_floating_point_operations`. A latent MoE's routed experts run at the latent
width, and its two projections between the model and latent widths are counted (as Megatron-LM
counts them, `training/training.py:433-445, 798-812`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from recipes.models.gpt.flops import mlp_flops


def moe_flops(s: Any) -> float:
    """Forward FLOPs per token of one MoE layer: the top-k routed experts, the latent
    projections when there is a latent space, and the shared experts."""
    shared = mlp_flops(s, s.moe_shared_ffn_hidden_size)
    routed_width = s.moe_router_topk * s.moe_ffn_hidden_size
    if not s.moe_latent_size:
        return mlp_flops(s, routed_width) + shared
    latent = dataclasses.replace(s, hidden_size=s.moe_latent_size)
    projections = 2 * (2 * s.hidden_size * s.moe_latent_size)
    return mlp_flops(latent, routed_width) + projections + shared

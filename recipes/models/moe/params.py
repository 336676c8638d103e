"""The MoE family's parameter terms on one rank: one mixture-of-experts MLP layer.

With a latent MoE (`model.moe_latent_size`, Nemotron 3 Super) the routed experts take and give
back tokens of the latent width, and the layer holds two projections between it and the model
width (`fc1_latent_proj`, `fc2_latent_proj`, `transformer/moe/moe_layer.py:264-289`): whole on
every TP rank ("duplicated"), so the dry run counts them once, like a norm. The router and the
shared experts stay at the model width (`transformer/moe/experts.py:215-245` takes the latent
width for routed experts only; `transformer/mlp.py:218-224`).
"""

from __future__ import annotations

from typing import Any

from recipes.models.counts import ParamCount
from recipes.models.gpt.params import mlp_width, norm_params


def expert_width(m: Any) -> int:
    """The width a routed expert reads and writes: the latent one, else the model's."""
    return m.moe_latent_size or m.hidden_size


def latent_projection_params(m: Any) -> int:
    """The two latent projections of one MoE layer (0 without a latent space)."""
    latent = m.moe_latent_size
    if not latent:
        return 0
    bias = int(m.add_bias_linear)
    return (m.hidden_size + bias) * latent + (latent + bias) * m.hidden_size


def routed_expert_params(m: Any) -> int:
    """One routed expert's two matrices, whole (before any expert-TP split)."""
    x, f = expert_width(m), m.moe_ffn_hidden_size or m.ffn_hidden_size
    return mlp_width(m, f) * x + x * f


def moe_mlp_params(m: Any, layout: Any) -> ParamCount:
    """Router (its expert bias is a buffer, not a parameter), the routed experts (split over
    EP and expert-TP), the shared experts (a dense MLP split over TP) and the latent
    projections (whole on every TP rank)."""
    h = m.hidden_size
    local_experts = m.num_moe_experts // layout.expert
    per_expert = routed_expert_params(m) // layout.expert_tensor_size
    router = m.num_moe_experts * h
    shared = m.moe_shared_expert_ffn_hidden_size or 0
    shared_split = (mlp_width(m, shared) * h + h * shared) // layout.tensor
    return ParamCount(tp_split=shared_split,
                      replicated=router + norm_params(m) + latent_projection_params(m),
                      expert=local_experts * per_expert)


def moe_gemm_weights(m: Any, layout: Any) -> ParamCount:
    """The routed and shared experts' weights and the latent projections on one rank (the
    router is not a GEMM weight)."""
    h = m.hidden_size
    per_expert = routed_expert_params(m) // layout.expert_tensor_size
    shared = m.moe_shared_expert_ffn_hidden_size or 0
    latent = 2 * h * m.moe_latent_size if m.moe_latent_size else 0
    return ParamCount(tp_split=(mlp_width(m, shared) * h + h * shared) // layout.tensor,
                      replicated=latent,
                      expert=m.num_moe_experts // layout.expert * per_expert)

"""The MoE family's parameter terms on one rank: one mixture-of-experts MLP layer."""

from __future__ import annotations

from typing import Any

from recipes.models.counts import ParamCount
from recipes.models.gpt.params import mlp_width, norm_params


def moe_mlp_params(m: Any, layout: Any) -> ParamCount:
    """Router (its expert bias is a buffer, not a parameter), the routed experts (split over
    EP and expert-TP) and the shared experts (a dense MLP split over TP)."""
    h, f = m.hidden_size, m.moe_ffn_hidden_size or m.ffn_hidden_size
    local_experts = m.num_moe_experts // layout.expert
    per_expert = (mlp_width(m, f) * h + h * f) // layout.expert_tensor_size
    router = m.num_moe_experts * h
    shared = m.moe_shared_expert_ffn_hidden_size or 0
    shared_split = (mlp_width(m, shared) * h + h * shared) // layout.tensor
    return ParamCount(tp_split=shared_split, replicated=router + norm_params(m),
                      expert=local_experts * per_expert)


def moe_gemm_weights(m: Any, layout: Any) -> ParamCount:
    """The routed and shared experts' weights on one rank (the router is not a GEMM weight)."""
    h, f = m.hidden_size, m.moe_ffn_hidden_size or m.ffn_hidden_size
    per_expert = (mlp_width(m, f) * h + h * f) // layout.expert_tensor_size
    shared = m.moe_shared_expert_ffn_hidden_size or 0
    return ParamCount(tp_split=(mlp_width(m, shared) * h + h * shared) // layout.tensor,
                      expert=m.num_moe_experts // layout.expert * per_expert)

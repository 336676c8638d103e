"""The hybrid family's own parameter terms on one rank: a Mamba2 layer and what an MTP depth
holds around its inner layers (its attention, MLP and MoE layers are the GPT and MoE
families')."""

from __future__ import annotations

from typing import Any

from recipes.models.counts import ParamCount
from recipes.models.gpt.params import norm_params
from recipes.models.hybrid.pattern import mamba_heads


def mamba_params(m: Any, tp: int) -> ParamCount:
    """A Mamba2 layer (`ssm/mamba_mixer.py:276-443`): in_proj to z, x, B, C and dt, the
    depthwise conv over x, B, C (weight and bias), dt_bias, A_log and D per head, the gated
    norm over d_inner, out_proj; all split over TP. The layer's input norm is replicated."""
    h, heads = m.hidden_size, mamba_heads(m)
    inner, bc = heads * m.mamba_head_dim, 2 * m.mamba_num_groups * m.mamba_state_dim
    in_proj = h * (2 * inner + bc + heads)
    conv = (inner + bc) * (m.mamba_conv_kernel + 1)
    split = in_proj + conv + 3 * heads + inner + inner * h
    return ParamCount(tp_split=split // tp, replicated=norm_params(m))


def mamba_gemm_weights(m: Any, tp: int) -> ParamCount:
    """A Mamba2 layer's in_proj and out_proj weights on one rank (conv, dt, A, D and the gated
    norm are not GEMM weights)."""
    h, heads = m.hidden_size, mamba_heads(m)
    inner, bc = heads * m.mamba_head_dim, 2 * m.mamba_num_groups * m.mamba_state_dim
    return ParamCount(tp_split=(h * (2 * inner + bc + heads) + inner * h) // tp)


def mtp_layer_params(m: Any, tp: int) -> ParamCount:
    """What one MTP depth holds around its inner layers (`transformer/multi_token_prediction.py:
    985-1050`): the norms of the embedding and of the hidden state, the projection of both
    (2 x hidden -> hidden, column-parallel, no bias) and the final norm. Its inner layers are
    the pattern's kinds, counted as the main decoder's."""
    h = m.hidden_size
    return ParamCount(tp_split=2 * h * h // tp, replicated=3 * norm_params(m))


def mtp_gemm_weights(m: Any, tp: int) -> ParamCount:
    """One MTP depth's projection weight on one rank (its norms are not GEMM weights)."""
    return ParamCount(tp_split=2 * m.hidden_size * m.hidden_size // tp)

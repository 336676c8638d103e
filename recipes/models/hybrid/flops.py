"""The hybrid family's own FLOPs terms: a Mamba2 layer's forward per token, and an MTP depth's
projection of the embedding and the hidden state (its attention, MLP and MoE layers are the GPT
and MoE families')."""

from __future__ import annotations

from typing import Any


def mamba_flops(s: Any) -> float:
    """Forward FLOPs per token of one Mamba2 layer: in_proj (z, x, B, C, dt), out_proj, and the
    chunked scan's products (its cost per token grows with the chunk, not the sequence)."""
    bc = 2 * s.mamba_groups * s.mamba_state
    projections = 2 * s.hidden_size * (2 * s.mamba_inner + bc + s.mamba_heads)
    projections += 2 * s.mamba_inner * s.hidden_size
    # Inside a chunk: C·Bᵀ (state-wide, per group) and its mix of x (per channel), over the
    # causal half of the chunk's positions: 2 · (Q / 2) · (groups · state + d_inner).
    intra_chunk = s.mamba_chunk * (s.mamba_groups * s.mamba_state + s.mamba_inner)
    # Between chunks: x·Bᵀ into the state and C·state out, 2 · d_inner · state each.
    states = 4 * s.mamba_inner * s.mamba_state
    return projections + intra_chunk + states


def mtp_projection_flops(s: Any) -> float:
    """Forward FLOPs per token of one MTP depth's projection: [embedding; hidden] (2·hidden)
    -> hidden (`transformer/multi_token_prediction.py:1147`); its norms are not counted."""
    return 2 * (2 * s.hidden_size) * s.hidden_size

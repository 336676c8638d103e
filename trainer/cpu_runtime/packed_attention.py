"""The CPU backend for packed (THD) batches: Megatron's local attention with a document mask.

Megatron's local `DotProductAttention` refuses THD `packed_seq_params` outright
(`transformer/dot_product_attention.py:153-156`); on GPU, Transformer Engine's attention takes
them instead, so this module is never used there. What the local path does take is a dense mask,
used exactly as given (`fusions/fused_softmax.py:323-329`; boolean, True = masked) and never
combined with the causal one. `PackedDotProductAttention` therefore turns the boundaries into one
lower-triangular block per segment and runs the unmodified forward with it.

What reaches core attention with THD: `SelfAttention` squeezes q/k/v to [T, heads, head_dim]
(`transformer/attention.py:1468-1471`) and has already applied RoPE per segment from the
boundaries (`:1477-1534`); after core attention it reshapes the output to [T, 1, hidden]
(`:1597-1602`). With sequence parallelism the column-parallel QKV projection has gathered the
whole row first, so T is always the full row. The subclass restores the dummy batch dim of 1 for
the stock [s, b, heads, head_dim] layout.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention

from trainer.cpu_runtime.norm import swap_spec_modules


def document_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """Bool [1, 1, length, length], True = masked: position i sees j only when j <= i and both
    lie in the same segment of `cu_seqlens` (0, running segment ends, `length`)."""
    bounds = cu_seqlens.reshape(-1).to(torch.long)
    if bounds[0] != 0 or bounds[-1] != length or bool((bounds[1:] < bounds[:-1]).any()):
        raise ValueError(
            f"cu_seqlens must start at 0, never decrease and end at the row length {length}, got "
            f"{bounds.tolist()}; build packed rows with plugins.protocol.packed_batch.packed_row"
        )
    positions = torch.arange(length, device=bounds.device)
    segment = torch.searchsorted(bounds[1:], positions, right=True)
    visible = (segment[:, None] == segment[None, :]) & (positions[None, :] <= positions[:, None])
    return ~visible[None, None]


def _self_attention_boundaries(params: PackedSeqParams) -> torch.Tensor:
    """The segment boundaries of the row; the padded ones when given, as RoPE uses them
    (`transformer/attention.py:1483-1491`). Only self-attention (q and kv alike) is handled."""
    q, kv = params.cu_seqlens_q_padded, params.cu_seqlens_kv_padded
    q = params.cu_seqlens_q if q is None else q
    kv = params.cu_seqlens_kv if kv is None else kv
    if q is None or (kv is not q and not torch.equal(q, kv)):
        raise ValueError(
            "packed_seq_params on CPU need cu_seqlens_q equal to cu_seqlens_kv (self-attention); "
            "build them as the packing plugin does (packed_seq_params)"
        )
    return q


def _check_mask_is_used(attention: DotProductAttention) -> None:
    """Two softmax settings drop a supplied mask without an error: the fused causal kernel in
    fp16/bf16 (`fusions/fused_softmax.py:285-291`) and a sliding window (`:321-322`)."""
    softmax = attention.scale_mask_softmax
    if softmax.scaled_masked_softmax_fusion and softmax.input_in_float16:
        raise ValueError(
            "packed batches on CPU need masked_softmax_fusion=False in fp16/bf16: the fused "
            "causal softmax ignores the document mask"
        )
    if softmax.window_size is not None:
        raise ValueError(
            f"packed batches on CPU do not support sliding-window attention (window "
            f"{softmax.window_size}): its mask replaces the document mask; use full attention"
        )


class PackedDotProductAttention(DotProductAttention):
    """`DotProductAttention` that also accepts THD `packed_seq_params` (CPU only)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            return super().forward(
                query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                attention_bias=attention_bias, packed_seq_params=packed_seq_params,
            )
        if attention_mask is not None:
            raise ValueError(
                "a dense attention_mask and THD packed_seq_params were both given; the packing "
                "plugin passes attention_mask=None, do not add a mask to packed batches"
            )
        _check_mask_is_used(self)
        mask = _cached_mask(packed_seq_params, query.size(0))
        # [T, heads, head_dim] -> [T, 1, heads, head_dim]: the stock layout with batch 1.
        query, key, value = (t.unsqueeze(1) if t.dim() == 3 else t for t in (query, key, value))
        return super().forward(
            query, key, value, mask, attn_mask_type=attn_mask_type,
            attention_bias=attention_bias, packed_seq_params=None,
        )


def _cached_mask(params: PackedSeqParams, length: int) -> torch.Tensor:
    """The mask, built once per forward: every layer gets the same `PackedSeqParams` object."""
    cached = getattr(params, "_cpu_document_mask", None)
    if cached is None or cached.size(-1) != length:
        cached = document_causal_mask(_self_attention_boundaries(params), length)
        params._cpu_document_mask = cached
    return cached


def use_packed_attention(spec: Any) -> Any:
    """`spec` (a GPT layer spec, layer-spec list or decoder block spec) with the local
    `DotProductAttention` replaced by `PackedDotProductAttention`; identical without packing."""
    return swap_spec_modules(spec, DotProductAttention, PackedDotProductAttention)

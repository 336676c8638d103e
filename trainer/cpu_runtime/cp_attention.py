"""A reference context-parallel attention for CPU ranks: a test backend, never used on GPU.

Megatron Core's local `DotProductAttention` refuses CP outright
(`transformer/dot_product_attention.py:56-58`); on GPU, Transformer Engine's attention runs CP
with a ring or all-to-all exchange (`cp_comm_type`). To train and test CP layouts on CPU, this
module gives each CP rank the result that exchange computes, by the plainest route:

1. gather every CP rank's keys and values along the sequence (backward: sum the gathered
   gradient over the CP group and keep this rank's part);
2. know the global position of every local query and every gathered key: each rank holds
   Megatron's load-balanced chunks r and 2·CP−1−r (`plugins/protocol/cp_split.py`), of the
   whole row or, for packed rows, of every document;
3. mask key j for query i unless pos(j) <= pos(i) and both lie in the same document, and run the
   stock local attention with that mask (`fusions/fused_softmax.py:323-329` uses a given mask as
   is). Attention is then exactly the single-rank attention, row by row.

It costs a whole-sequence K/V gather per layer and an [s/CP, s] score matrix, which is why it is a
test backend only: it exists to show that the batch split, RoPE chunks, loss and gradient
reduction of a CP layout train the same model as one rank.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention

from plugins.protocol.cp_split import balanced_positions, document_positions
from trainer.cpu_runtime.norm import swap_spec_modules
from trainer.cpu_runtime.packed_attention import (
    PackedDotProductAttention,
    _check_mask_is_used,
    _self_attention_boundaries,
)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward sums the full gradient over the group and
    keeps this rank's slice (gloo has no reduce-scatter, so all-reduce then slice)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(group.size())]
        torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.group.size(), dim=0)[ctx.group.rank()], None


def cp_positions(length: int, cp: int, bounds: list[int] | None) -> list[list[int]]:
    """Global positions held by each CP rank (rank order) of a row of `length` local-times-CP
    tokens: the row's balanced chunks, or each document's when `bounds` (padded) are given."""
    if bounds is None:
        return [balanced_positions(length, cp, rank) for rank in range(cp)]
    return [document_positions(bounds, cp, rank) for rank in range(cp)]


def cp_causal_mask(
    positions: list[list[int]], rank: int, bounds: list[int] | None
) -> torch.Tensor:
    """Bool [1, 1, local, global], True = masked, for this rank's queries against the keys
    gathered in rank order: visible when the key is not later and in the same document."""
    queries = torch.tensor(positions[rank])
    keys = torch.tensor([p for rank_positions in positions for p in rank_positions])
    visible = keys[None, :] <= queries[:, None]
    if bounds is not None:
        ends = torch.tensor(bounds[1:])
        same = torch.searchsorted(ends, queries, right=True)[:, None] == torch.searchsorted(
            ends, keys, right=True
        )[None, :]
        visible &= same
    return ~visible[None, None]


def _without_cp(config: Any) -> Any:
    """The config the stock attention is built with: the same, with CP 1 (it refuses CP)."""
    local = copy.copy(config)
    local.context_parallel_size = 1
    return local


class ContextParallelDotProductAttention(PackedDotProductAttention):
    """Local attention that runs under CP (and takes packed rows) on CPU."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(_without_cp(config), *args, **kwargs)
        self.cp_group = parallel_state.get_context_parallel_group()
        self._cpu_cp_mask: torch.Tensor | None = None

    def _mask(self, local_length: int, params: PackedSeqParams | None) -> torch.Tensor:
        """The mask, built once: per module for whole rows (it depends only on the length), and
        once per micro-batch for packed rows, on the `PackedSeqParams` every layer shares."""
        holder = self if params is None else params
        cached = getattr(holder, "_cpu_cp_mask", None)
        if cached is None or cached.size(-2) != local_length:
            cp, rank = self.cp_group.size(), self.cp_group.rank()
            bounds = None if params is None else _self_attention_boundaries(params).tolist()
            positions = cp_positions(local_length * cp, cp, bounds)
            cached = cp_causal_mask(positions, rank, bounds)
            holder._cpu_cp_mask = cached
        return cached

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
        if self.cp_group.size() == 1:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                attention_bias=attention_bias, packed_seq_params=packed_seq_params,
            )
        if attention_mask is not None:
            raise ValueError(
                "context parallel on CPU builds its own causal mask; a dense attention_mask "
                "cannot be split over CP ranks here (use data.documents=packed for "
                "per-document attention)"
            )
        _check_mask_is_used(self)
        thd = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        mask = self._mask(query.size(0), packed_seq_params if thd else None)
        if thd:  # [T, heads, head_dim] -> [T, 1, heads, head_dim]
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
        key = _GatherSequence.apply(key, self.cp_group)
        value = _GatherSequence.apply(value, self.cp_group)
        return DotProductAttention.forward(
            self, query, key, value, mask, attn_mask_type=attn_mask_type,
            attention_bias=attention_bias, packed_seq_params=None,
        )


def use_cp_attention(spec: Any) -> Any:
    """`spec` (already through `use_packed_attention`) with the CPU reference CP attention."""
    return swap_spec_modules(spec, PackedDotProductAttention, ContextParallelDotProductAttention)


def thd_get_partitioned_indices(
    cu_seqlens: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """CPU stand-in for Transformer Engine's `tex.thd_get_partitioned_indices`: the row
    positions CP rank `cp_rank` keeps of a packed row whose (padded) documents end at
    `cu_seqlens` — chunks r and 2·CP−1−r of every document, in row order."""
    bounds = cu_seqlens.reshape(-1).tolist()
    if bounds[-1] != total_tokens:
        raise ValueError(
            f"cu_seqlens end at {bounds[-1]} but the row has {total_tokens} tokens; pass the "
            "padded boundaries of the whole row"
        )
    return torch.tensor(document_positions(bounds, cp_size, cp_rank), dtype=torch.long)


class _TexOnCpu:
    """Megatron's `tex` (TE's extension module, or None without TE) with its per-document CP
    split answered by the torch stand-in: TE's is a CUDA kernel. Other names go to TE's."""

    thd_get_partitioned_indices = staticmethod(thd_get_partitioned_indices)

    def __init__(self, tex: Any) -> None:
        self._tex = tex

    def __getattr__(self, name: str) -> Any:
        if self._tex is None:
            raise AttributeError(f"Transformer Engine is not installed: no tex.{name}")
        return getattr(self._tex, name)


def install_thd_partition() -> None:
    """Megatron's per-document CP split calls TE's `tex.thd_get_partitioned_indices`
    (`core/utils.py:2441-2448`): `tex` is None without TE (`core/utils.py:58-64`), and TE's is
    a CUDA kernel where TE is installed. Gives the module a `tex` whose split is the stand-in
    with the same arithmetic, on every CPU rank."""
    from megatron.core import utils

    if not isinstance(utils.tex, _TexOnCpu):
        utils.tex = _TexOnCpu(utils.tex)

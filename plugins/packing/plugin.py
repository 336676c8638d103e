"""Hands each packed micro-batch's document boundaries to the model as THD `PackedSeqParams`.

Every pipeline stage runs attention, so every stage must get the boundaries (a known failure
elsewhere gave only the first and last stage `cu_seqlens`, and middle stages attended across
documents). The trainer calls `forward_kwargs` for every micro-batch on every stage, which is
where this plugin builds them. On GPU, Transformer Engine's attention consumes them (as
`padding_causal`, `extensions/transformer_engine.py:2036-2043`); on CPU, the CPU runtime's
`PackedDotProductAttention` turns them into a dense per-document causal mask.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from plugins.protocol.errors import UserError
from plugins.protocol.events import RunStart
from plugins.protocol.hooks import Plugin


def _check_packed(batch: dict[str, Any]) -> None:
    missing = [key for key in ("cu_seqlens", "max_seqlen", "total_tokens") if key not in batch]
    if missing:
        raise UserError(
            f"packed rows (data.documents=packed or inter_document) need {'/'.join(missing)} in "
            "every micro-batch, this one has none: its data source does not pack documents; "
            "train on a blend with data.documents=packed, or set data.documents=concatenate"
        )
    rows = batch["tokens"].shape[0]
    if rows != 1:
        raise UserError(
            f"packed rows (data.documents=packed or inter_document) need one row per "
            f"micro-batch, got {rows}; set train.micro_batch_size=1"
        )


def packed_seq_params(batch: dict[str, Any], mamba_layers: bool = False) -> PackedSeqParams:
    """THD parameters of one packed row (self-attention: the same boundaries for q and kv; the
    padded bounds too when documents are padded, as context parallel needs).

    `max_seqlen` becomes a Python int: the rotary table is cached by its length
    (`models/common/embeddings/rotary_pos_embedding.py:177`, an lru_cache), and TE takes an int.
    With Mamba layers, `total_tokens` (the batch's plain int: the whole row, before any CP
    split) makes `PackedSeqParams` build `seq_idx` (`packed_seq_params.py:30-66`), the document
    index Mamba layers reset their state by; without it they would scan the row as one sequence.
    A model without Mamba layers is not given it: building `seq_idx` is a `repeat_interleave`
    whose output size a GPU must report back to the host, once per micro-batch, for nothing.
    """
    _check_packed(batch)
    cu_seqlens = batch["cu_seqlens"].reshape(-1).to(torch.int32)
    padded = batch.get("cu_seqlens_padded")
    if padded is not None:  # documents padded in the row (context parallel: to 2 x CP)
        padded = padded.reshape(-1).to(torch.int32)
    max_seqlen = int(batch["max_seqlen"])
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
        total_tokens=int(batch["total_tokens"]) if mamba_layers else None,
    )


class PackingPlugin(Plugin):
    def __init__(self, mamba_layers: bool = True) -> None:
        # Set from the run's model at run start; until then the safe side (a Mamba layer
        # without seq_idx would scan a packed row as one sequence, silently).
        self.mamba_layers = mamba_layers

    def run_start(self, start: RunStart) -> None:
        self.mamba_layers = start.config.model.is_hybrid

    def forward_kwargs(self, batch: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        # `attention_mask` is a required argument of GPTModel.forward, so it is set to None
        # rather than removed: the boundaries replace any dense mask.
        params = packed_seq_params(batch, self.mamba_layers)
        return {**kwargs, "attention_mask": None, "packed_seq_params": params}

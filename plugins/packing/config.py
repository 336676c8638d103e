"""Config of the packing plugin (torch-free): when micro-batches are packed rows, and its rules.

Packing is a plugin, not a data field alone: besides a data source that packs, it changes what
reaches the model (`packed_seq_params`, no dense mask) and brings layout rules of its own. It has
no switch of its own: it is on exactly when `data.documents` makes packed batches, so the data
and the model cannot be set out of step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol.hooks import Plugin, PluginConfig, Rule


def check_packing_micro_batch(cfg: Any) -> str | None:
    """A packed micro-batch is one row: THD flattens the micro-batch into one token stream and
    the attention squeezes its batch dim (`transformer/attention.py:1468-1471`), so rows of a
    larger micro-batch would need their boundaries merged first; pack more documents per row."""
    mbs = cfg.train.micro_batch_size
    if cfg.data.packed_rows and mbs != 1:
        return (
            f"data.documents={cfg.data.documents} makes packed rows, which need "
            f"train.micro_batch_size=1 (one packed row per micro-batch: THD attention flattens "
            f"the batch into one stream), got {mbs}; set train.micro_batch_size=1 and pack more "
            "documents into each row"
        )
    return None


def check_packing_context_parallel(cfg: Any) -> str | None:
    """THD with CP needs every document padded to a multiple of 2 x CP (`core/utils.py:2413-2414`,
    `cu_seqlens_padded`). Exact packs do that: under CP the pack index is built for padded
    lengths and each row pads its documents (`document_pad_multiple` in
    `plugins/protocol/packed_batch.py`). Megatron's GPTDataset rows (`inter_document`) are cut
    from the document stream and not padded per document, so that mode stays refused with CP."""
    cp, documents = cfg.parallel.context, cfg.data.documents
    if documents == "inter_document" and cp != 1:
        return (
            f"data.documents=inter_document does not support parallel.context={cp} (Megatron's "
            "GPTDataset rows do not pad each document to a multiple of 2 x CP); set "
            "data.documents=packed (pads each document) or parallel.context=1"
        )
    return None


@dataclass(kw_only=True)
class PackingConfig(PluginConfig):
    """Packed micro-batches (several documents per row) with per-document attention; on exactly
    when `data.documents` makes packed batches (no settings of its own)."""

    def rules(self) -> tuple[Rule, ...]:
        return (check_packing_micro_batch, check_packing_context_parallel)

    def retired_keys(self) -> dict[str, str]:
        return {"enabled": "removed: packing follows data.documents (on for data.documents="
                           "packed or inter_document on a blend); delete the key, and set "
                           "data.documents=packed to train on packed rows"}

    def active(self, cfg: Any) -> bool:
        return cfg.data.packed_rows  # the core config says it (`DataConfig.packed_rows`)

    def build(self) -> Plugin | None:
        from plugins.packing.plugin import PackingPlugin

        return PackingPlugin()

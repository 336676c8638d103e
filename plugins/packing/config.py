"""Config of the packing plugin (torch-free): whether micro-batches are packed rows, and its rules.

Packing is a plugin, not a data field alone: besides a data source that packs, it changes what
reaches the model (`packed_seq_params`, no dense mask) and brings layout rules of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol.hooks import Plugin, PluginConfig, Rule


def check_packed_documents_need_packing(cfg: Any) -> str | None:
    """Document modes other than concatenation make packed batches from prepared data (the core
    rule asks for the blend); without this plugin the model would get no cu_seqlens and attend
    across documents."""
    documents = cfg.data.documents
    packed_data = documents != "concatenate" and cfg.data.source == "blend"
    if packed_data and not cfg.plugins.packing.enabled:
        return (f"data.documents={documents} makes packed batches, which need the packing "
                "plugin; set plugins.packing.enabled=true (and train.micro_batch_size=1)")
    return None


def check_packing_micro_batch(cfg: Any) -> str | None:
    """A packed micro-batch is one row: THD flattens the micro-batch into one token stream and
    the attention squeezes its batch dim (`transformer/attention.py:1468-1471`), so rows of a
    larger micro-batch would need their boundaries merged first; pack more documents per row."""
    mbs = cfg.train.micro_batch_size
    if cfg.plugins.packing.enabled and mbs != 1:
        return (
            f"plugins.packing.enabled=true needs train.micro_batch_size=1 (one packed row per "
            f"micro-batch: THD attention flattens the batch into one stream), got {mbs}; set "
            "train.micro_batch_size=1 and pack more documents into each row"
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
    """Packed micro-batches (several documents per row) with per-document attention."""

    enabled: bool = False  # micro-batches carry cu_seqlens/max_seqlen; attention stays in-document

    def rules(self) -> tuple[Rule, ...]:
        return (check_packed_documents_need_packing, check_packing_micro_batch,
                check_packing_context_parallel)

    def build(self) -> Plugin | None:
        if not self.enabled:
            return None
        from plugins.packing.plugin import PackingPlugin

        return PackingPlugin()

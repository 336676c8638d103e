"""The packed micro-batch format: one row of several documents, as data preparation packs it,
the trainer builds it and the packing plugin and CPU attention read it.

A packed micro-batch is a dict for ONE row of `S` tokens (micro-batch size 1); this module builds
it as NumPy arrays (torch-free, like the rest of the protocol) and the trainer hands the same
values to the model as tensors (`trainer/data.py`):

    tokens        int64 [1, S]   the documents in order, then `pad_id` up to S
    labels        int64 [1, S]   each document's own next token; `pad_id` where there is none
    loss_mask     fp32  [1, S]   1 where the label is a next token of the same document, else 0
    position_ids  int64 [1, S]   0.. restarted at every segment (documents, then the padding)
    cu_seqlens    int32 [n + 1]  0, running segment ends, S: the n documents, then the padding
                                 as a segment of its own when there is any
    max_seqlen    int            the longest segment (the longest document, unless the padding
                                 is longer), never the row length when there are two segments;
                                 a Python int, so no device ever has to be read back for it
    total_tokens  int            the row length S, before any context-parallel split: Mamba
                                 layers need it (Megatron builds their per-document `seq_idx`
                                 from it); a Python int, for the same reason as `max_seqlen`
    documents     int            n, the documents among the segments (the padding segment, if
                                 any, comes after them): the trainer counts model FLOPs over
                                 the documents alone (`document_lengths`), on the host

A document of n tokens occupies n positions and gives n - 1 loss tokens: position i predicts
token i + 1 of the same document, and its last position predicts nothing (loss mask 0), so no
label crosses a boundary. This is Megatron's stream format with `eod_mask_loss`: end each
document with its end-of-document token and the model learns to end documents but never to
guess what the next one starts with (`docs/packed-sequences.md`, "Labels and loss mask").

Why `max_seqlen` is a segment length: with THD, RoPE restarts positions per segment only while
the rotary table is shorter than the row (`models/common/embeddings/rope_utils.py:224-225`,
`:252-268`); a table of exactly S rows silently switches to positions that run on across
documents. It must still cover every segment, padding included, or RoPE cannot slice it.

Under context parallelism Megatron cuts every document of a packed row into 2 x CP chunks
(`core/utils.py:2413-2414`), so each document occupies its length rounded up to a multiple of
2 x CP (`document_pad_multiple`), its own padding after it; exact packs are made for those padded
lengths (`data_prep/packing.py`) and the row then also carries

    cu_seqlens_padded  int32 [n + 1]  the segment bounds in the row (padded documents), while
                                      `cu_seqlens` counts each document's own tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

PACKED_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen",
               "total_tokens", "documents")


def document_pad_multiple(context_parallel: int) -> int:
    """What each packed document's length is padded to a multiple of: 2 x CP under context
    parallelism (Megatron's per-document split into 2 x CP chunks), else 1."""
    return 2 * context_parallel if context_parallel > 1 else 1


def padded_length(length, multiple: int):
    """`length` rounded up to a multiple of `multiple` (an int, or a NumPy array of them)."""
    return -(-length // multiple) * multiple


def _as_documents(documents: Sequence) -> list[np.ndarray]:
    docs = [np.asarray(doc).astype(np.int64, copy=False).reshape(-1) for doc in documents]
    for index, doc in enumerate(docs):
        if doc.size == 0:
            raise ValueError(f"document {index} is empty; drop empty documents before packing")
    return docs


def segment_lengths(document_lengths: Sequence[int], seq_length: int) -> list[int]:
    """Lengths of the row's segments: each document, then the padding (if any) as one more."""
    used = sum(document_lengths)
    if used > seq_length:
        raise ValueError(
            f"documents of {used} tokens do not fit a row of seq_length={seq_length}; pack fewer "
            "documents per row or split long documents first"
        )
    padding = seq_length - used
    return [*document_lengths, padding] if padding else list(document_lengths)


def packed_row(
    documents: Sequence, seq_length: int, pad_id: int, pad_multiple: int = 1
) -> dict[str, np.ndarray | int]:
    """One packed micro-batch (see the module docstring) from `documents` (1-D token arrays,
    placed in order) and the row length `seq_length`; the rest of the row is `pad_id`.

    With `pad_multiple` > 1 (context parallel: 2 x CP) each document occupies a multiple of that
    many positions, its own padding after it (loss 0, never attended to by the document's
    tokens, which come first); the row then also carries `cu_seqlens_padded`, the segment
    bounds in the row, while `cu_seqlens` counts each document's own tokens."""
    docs = _as_documents(documents)
    real = [doc.size for doc in docs]
    segments = segment_lengths([padded_length(n, pad_multiple) for n in real], seq_length)
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, pad_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    start = 0
    for doc, room in zip(docs, segments, strict=False):
        end = start + doc.size
        tokens[start:end] = doc
        labels[start : end - 1] = doc[1:]
        loss_mask[start : end - 1] = 1.0
        start += room
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in segments])
    row: dict[str, np.ndarray | int] = {
        "tokens": tokens[None],
        "labels": labels[None],
        "loss_mask": loss_mask[None],
        "position_ids": positions[None],
        "cu_seqlens": np.array([0, *accumulate(segments)], dtype=np.int32),
        "max_seqlen": int(max(segments)),
        "total_tokens": int(seq_length),
        "documents": len(docs),
    }
    if pad_multiple > 1:
        own = [*real, *segments[len(real):]]  # the row's trailing padding stays one segment
        row["cu_seqlens_padded"] = row["cu_seqlens"]
        row["cu_seqlens"] = np.array([0, *accumulate(own)], dtype=np.int32)
    return row


def document_lengths(batch: dict) -> np.ndarray:
    """Each document's own length in a packed micro-batch: its `cu_seqlens` segments, less the
    padding segment after the documents (`documents` says how many come first; a batch
    without it is all documents, as Megatron's inter-document samples are). Read from host
    arrays or CPU tensors: nothing is read back from a device."""
    bounds = np.asarray(batch["cu_seqlens"]).reshape(-1).astype(np.int64)
    lengths = np.diff(bounds)
    return lengths[: int(batch.get("documents", len(lengths)))]

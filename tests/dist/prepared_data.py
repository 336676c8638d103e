"""A small prepared dataset for the data tests: synthetic documents, byte-level ids, written with
Megatron Core's `IndexedDatasetBuilder` (as scripts/prepare_data.py writes them), plus a blend
file naming it. Byte ids keep the tiny recipes' vocabulary (256; EOD is 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data_prep.byte_tokenizer import ByteTokenizer
from data_prep.corpus import synthetic_documents


def write_byte_dataset(folder: Path, name: str = "synthetic", max_bytes: int = 120_000,
                       seed: int = 7) -> str:
    """Write `<folder>/<name>.bin/.idx` (one sequence per document, EOD appended); the prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / name)
    tokenizer = ByteTokenizer()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for text in synthetic_documents(max_bytes, seed=seed):
        ids = np.append(tokenizer.encode(text), tokenizer.eod).astype(np.int64)
        builder.add_document(torch.from_numpy(ids), [len(ids)])
    builder.finalize(prefix + ".idx")
    return prefix


def write_blend(folder: Path, prefix: str, split: tuple[int, int] = (90, 10)) -> str:
    """A blend file naming one prefix, with the byte tokenizer's EOD and vocabulary."""
    path = folder / "blend.yaml"
    path.write_text(
        f"train:\n  - {{prefix: {prefix}, weight: 1.0}}\nsplit: [{split[0]}, {split[1]}]\n"
        "eod_id: 0\nvocab_size: 256\n", encoding="utf-8"
    )
    return str(path)


def train_steps_on_packs_padded_for(payload: dict) -> dict:
    """Rank entry: `tests.dist.layout_runs.train_steps` on the pack index made for the pad
    multiple `payload['index_pad_multiple']` (what a run at CP = multiple / 2 reads), its rows
    built without per-document padding: the same documents in the same rows, as plain packed
    rows, the reference a context-parallel run on that index must equal. The trainer picks the
    index by the run's own CP size, so this rank swaps the index lookup (this process only)."""
    from tests.dist import layout_runs
    from trainer import data

    multiple, find = payload["index_pad_multiple"], data._pack_index
    data._pack_index = lambda prefix, seq, seed, _multiple: find(prefix, seq, seed, multiple)
    return layout_runs.train_steps(payload)

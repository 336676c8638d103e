"""A small prepared dataset for the data tests: synthetic documents, byte-level ids, written with
Megatron Core's `IndexedDatasetBuilder` (as scripts/prepare_data.py writes them), plus a blend
file naming it. Byte ids keep the tiny recipes' vocabulary (256; EOD is 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data_prep.corpus import synthetic_documents
from data_prep.tokenizer import ByteTokenizer


def write_byte_dataset(folder: Path, name: str = "synthetic", max_bytes: int = 120_000) -> str:
    """Write `<folder>/<name>.bin/.idx` (one sequence per document, EOD appended); the prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / name)
    tokenizer = ByteTokenizer()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for text in synthetic_documents(max_bytes, seed=7):
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

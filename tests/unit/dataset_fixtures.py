"""Small Megatron Core indexed datasets for the tests that check blends and their files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np


def write_dataset(prefix: Path, documents: list[list[int]], dtype=np.uint16) -> str:
    """`<prefix>.bin/.idx` through Megatron Core's own writer, one sequence per document
    (an empty list is a zero-length document); returns the prefix as text."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for tokens in documents:
        builder.add_document(np.asarray(tokens, dtype=dtype), [len(tokens)] if tokens else [])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)

"""Byte-level tokenizer: needs no download or training, vocabulary of 256."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
    """UTF-8 bytes as token ids. Id 0 (the NUL byte, absent from text files) ends a document."""

    vocab_size = 256
    eod = 0

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: np.ndarray) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8)).decode("utf-8", errors="replace")

    def encode_documents(self, documents) -> np.ndarray:
        """One stream of token ids with an end-of-document id after every document."""
        parts = []
        for text in documents:
            parts.append(self.encode(text))
            parts.append(np.array([self.eod], dtype=np.uint8))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

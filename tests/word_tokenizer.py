"""A five-word tokenizer for tests that prepare data: word-level over whitespace, with the
end-of-document token prepare_data looks for, built in the test's folder (no download)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ["[UNK]", "<|endoftext|>", "alpha", "beta", "gamma"]


def word_tokenizer(folder: Path) -> Path:
    """`folder/tokenizer.json`, each of `WORDS` one id (in order), anything else `[UNK]`."""
    made = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    path = folder / "tokenizer.json"
    made.save(str(path))
    return path

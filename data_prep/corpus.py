"""Text corpora that exist on any machine: Python's own standard library, or synthetic text.

Documents are returned in a fixed order (sorted paths) so a run's data is reproducible on the
same Python version.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def python_stdlib_documents(max_bytes: int) -> Iterator[str]:
    """The `.py` sources of this interpreter's standard library, sorted, up to `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = ("site-packages", "test", "tests", "idlelib", "lib2to3")
    total = 0
    for path in sorted(root.rglob("*.py")):
        if any(part in skipped for part in path.relative_to(root).parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        total += len(text.encode("utf-8"))
        yield text
        if total >= max_bytes:
            return


_SYNTHETIC_WORDS = (
    "the model reads tokens and predicts the next one while pipeline stages pass activations "
    "forward and gradients backward across tensor parallel ranks that split every matrix"
).split()


def synthetic_documents(max_bytes: int, seed: int = 0) -> Iterator[str]:
    """Deterministic word-salad documents (a fixed vocabulary, seeded lengths): learnable and
    identical on every machine, so golden loss traces do not depend on the Python version."""
    rng = np.random.default_rng(seed)
    total = 0
    while total < max_bytes:
        words = rng.choice(_SYNTHETIC_WORDS, size=int(rng.integers(8, 120)))
        text = " ".join(words) + "."
        total += len(text)
        yield text


def corpus_documents(source: str, max_bytes: int, seed: int = 0) -> Iterator[str]:
    if source == "python_stdlib":
        return python_stdlib_documents(max_bytes)
    if source == "synthetic":
        return synthetic_documents(max_bytes, seed)
    raise ValueError(f"unknown corpus source {source!r}")


def write_corpus_jsonl(source: str, path: Path, max_bytes: int, seed: int = 0) -> Path:
    """A named built-in corpus as one JSONL file (`{"text": ...}` per document), written under
    a temporary name and renamed when complete, so scripts/prepare_data.py can read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as handle:
        for text in corpus_documents(source, max_bytes, seed):
            handle.write(json.dumps({"text": text}) + "\n")
    partial.rename(path)
    return path

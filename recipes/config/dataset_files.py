"""An indexed dataset's files (`<prefix>.bin`, `<prefix>.idx`) checked before any rank reads them.

Megatron Core maps the `.idx` and trusts it: a truncated, empty or foreign index, or a `.bin`
shorter than its index says, surfaces on every rank as a traceback from numpy or `struct`
(`buffer is smaller than requested size`, `bad header`, `offset must be non-negative`), and ids
beyond the model's vocabulary as an `IndexError` in the first forward pass. These checks read
the index (its header, its lengths, pointers and document indices, memory-mapped) and the
`.bin`'s size, never the tokens themselves, except for two bounded looks at a bare prefix that
no manifest describes: the largest id among its first and last `SCAN_TOKENS` tokens, and the
last token of up to `EOD_SAMPLES` documents (a preparation ends every document with its EOD).

The index layout is Megatron Core's writer's (`megatron/core/datasets/indexed_dataset.py:143-
200`): the 9-byte header `MMIDIDX\\0\\0`, version `<Q`, dtype code `<B`, sequence and document
counts `<Q`, then int32 sequence lengths, int64 byte pointers and int64 document indices.
Every function returns None or one line naming the file and the fix.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
HEADER_BYTES = len(HEADER) + 8 + 1 + 8 + 8
# Megatron Core's DType codes (indexed_dataset.py:50-60) -> numpy dtypes.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
SCAN_TOKENS = 1 << 20  # a bare prefix: ids looked at, at its start and at its end
EOD_SAMPLES = 4096  # a bare prefix: documents whose last token is compared with eod_id
CRC_CHUNK = 1 << 24
SAMPLE_BYTES = 1 << 16  # a manifest's fingerprint of a .bin: CRC-32 of its first and last bytes
RECORD_KEYS = ("bin_bytes", "idx_bytes", "idx_crc32", "bin_sample_crc32")
# The JSON of a pack index beside a dataset (`data_prep.packing.pack_index_paths` names it
# `<prefix>.pack<N>[.pad<m>].json`): never a manifest, so manifest lookups pass it over.
PACK_INDEX_JSON = re.compile(r"\.pack\d+(\.pad\d+)?\.json$")


@dataclass(frozen=True)
class IndexFacts:
    """What a sound index says about its dataset."""

    prefix: str
    dtype: type[np.number]
    sequences: int
    documents: int  # document entries (zero-length documents included)
    tokens: int
    idx_bytes: int
    bin_bytes: int


def idx_path(prefix: str) -> Path:
    return Path(prefix + ".idx")


def bin_path(prefix: str) -> Path:
    return Path(prefix + ".bin")


def _again(prefix: str) -> str:
    return f"prepare {prefix} again with scripts/prepare_data.py (or restore both files)"


def _header(prefix: str) -> tuple[tuple[int, int, int, int], int] | str:
    """(version, dtype code, sequences, documents) and the file's size, or the problem."""
    path = idx_path(prefix)
    size = path.stat().st_size
    if size == 0:
        return f"{path} is empty (0 bytes); {_again(prefix)}"
    with path.open("rb") as stream:
        head = stream.read(HEADER_BYTES)
    if head[:len(HEADER)] != HEADER[:len(head)] or len(head) < len(HEADER):
        return (f"{path} is not a Megatron indexed-dataset index (its first bytes are not "
                f"{HEADER!r}); {_again(prefix)}")
    if len(head) < HEADER_BYTES:
        return (f"{path} is truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte "
                f"header; {_again(prefix)}")
    fields = struct.unpack("<QBQQ", head[len(HEADER):])
    return fields, size


def document_count(prefix: str) -> int | None:
    """The documents an index holds (Megatron's `numel_low_level_dataset`: its document index
    entries less one), or None when the index cannot be read (its own rules say why)."""
    try:
        header = _header(prefix)
    except OSError:
        return None
    return None if isinstance(header, str) else header[0][3] - 1


def index_problem(prefix: str) -> str | None:
    """None when the `.idx` is whole and the `.bin` is as long as it says; else the problem."""
    read = read_index(prefix)
    return read if isinstance(read, str) else None


def read_index(prefix: str) -> IndexFacts | str:
    """The index's facts, or the one line saying what is wrong with the pair."""
    header = _header(prefix)
    if isinstance(header, str):
        return header
    (version, code, sequences, documents), size = header
    path = idx_path(prefix)
    if version != 1 or code not in DTYPES:
        return (f"{path} has version {version} and dtype code {code}; Megatron Core reads "
                f"version 1 and codes {min(DTYPES)}-{max(DTYPES)}; {_again(prefix)}")
    expected = HEADER_BYTES + sequences * (4 + 8) + documents * 8
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        return (f"{path} is {state}: {sequences:,} sequences and {documents:,} document "
                f"entries need {expected:,} bytes, it has {size:,}; {_again(prefix)}")
    facts = _arrays(prefix, code, sequences, documents, size)
    return facts


def _arrays(prefix: str, code: int, sequences: int, documents: int,
            size: int) -> IndexFacts | str:
    path, data = idx_path(prefix), bin_path(prefix)
    dtype = DTYPES[code]
    itemsize = np.dtype(dtype).itemsize
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    lengths = np.frombuffer(mapped, np.int32, sequences, HEADER_BYTES)
    pointers = np.frombuffer(mapped, np.int64, sequences, HEADER_BYTES + 4 * sequences)
    doc_index = np.frombuffer(mapped, np.int64, documents, HEADER_BYTES + 12 * sequences)
    tokens = int(lengths.sum(dtype=np.int64))
    bad_docs = documents < 1 or doc_index[0] != 0 or doc_index[-1] != sequences or bool(
        np.any(np.diff(doc_index) < 0))
    ends = np.cumsum(lengths, dtype=np.int64) * itemsize
    bad_pointers = sequences and (pointers[0] != 0 or bool(
        np.any(pointers[1:] != ends[:-1])))
    if bad_docs or bad_pointers or bool(np.any(lengths < 0)):
        return (f"{path} is damaged: its lengths, pointers and document indices disagree; "
                f"{_again(prefix)}")
    need, have = tokens * itemsize, data.stat().st_size
    if have < need:
        return (f"{data} is shorter than its index says ({have:,} bytes, {path} describes "
                f"{tokens:,} {np.dtype(dtype).name} tokens = {need:,} bytes): it is truncated "
                f"or the .idx comes from another preparation; {_again(prefix)}")
    if have > need:
        return (f"{path} does not belong to {data} (it describes {need:,} bytes of tokens, the "
                f".bin holds {have:,}): the .idx comes from another preparation; "
                f"{_again(prefix)}")
    return IndexFacts(prefix, dtype, sequences, documents, tokens, size, have)


def empty_problem(facts: IndexFacts) -> str | None:
    """A dataset with no tokens: its `.bin` is empty, and Megatron Core's reader maps it, which
    fails on every rank (`ValueError: cannot mmap an empty file`). Older preparations wrote
    such shards (more shards than a compressed input could fill, a tiny held-out share)."""
    if facts.tokens > 0:
        return None
    return (f"{bin_path(facts.prefix)} holds no tokens ({facts.documents - 1:,} documents, none "
            "with text), which Megatron cannot read; remove it from the blend, or prepare the "
            "data again with scripts/prepare_data.py and fewer num_shards/valid_shards (it "
            "refuses to write an empty shard)")


def crc32(path: Path) -> int:
    """CRC-32 of a file, read in chunks (an index: O(index))."""
    value = 0
    with path.open("rb") as stream:
        while chunk := stream.read(CRC_CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def sample_crc32(path: Path) -> int:
    """CRC-32 of a file's first and last SAMPLE_BYTES (bounded, whatever the file's size)."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        value = zlib.crc32(stream.read(SAMPLE_BYTES))
        stream.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
        return zlib.crc32(stream.read(SAMPLE_BYTES), value)


def record(prefix: str) -> dict[str, int]:
    """What a manifest records of a dataset's files, to know them again: sizes, the index's
    CRC-32 and a bounded fingerprint of the tokens."""
    return {"bin_bytes": bin_path(prefix).stat().st_size,
            "idx_bytes": idx_path(prefix).stat().st_size, "idx_crc32": crc32(idx_path(prefix)),
            "bin_sample_crc32": sample_crc32(bin_path(prefix))}


def recorded_problem(prefix: str, shard: dict, manifest: str) -> str | None:
    """A sound pair that is not the pair `manifest` recorded (older manifests record none)."""
    if "idx_crc32" not in shard:
        return None
    now = record(prefix)
    changed = [key for key in RECORD_KEYS if key in shard and now[key] != shard[key]]
    if not changed:
        return None
    differ = ", ".join(changed)
    return (f"{prefix}.bin/.idx are not the files manifest {manifest} recorded ({differ} "
            f"differ): another preparation's files are in their place; {_again(prefix)}")


def _tokens(facts: IndexFacts, start: int, count: int) -> np.ndarray:
    """Tokens `start` to `start + count` (fewer at the end), read, not mapped."""
    count = max(0, min(count, facts.tokens - start))
    itemsize = np.dtype(facts.dtype).itemsize
    return np.fromfile(bin_path(facts.prefix), facts.dtype, count, offset=start * itemsize)


def largest_id(facts: IndexFacts, window: int = SCAN_TOKENS) -> tuple[int, int]:
    """(largest id, tokens looked at) over the first and last `window` tokens."""
    if facts.tokens == 0:
        return -1, 0
    head = _tokens(facts, 0, window)
    tail = _tokens(facts, max(window, facts.tokens - window), window)
    seen = np.concatenate([head, tail])
    return int(seen.max()), int(seen.size)


def document_ends(facts: IndexFacts) -> np.ndarray:
    """The last token of up to EOD_SAMPLES non-empty sequences, spread over the dataset."""
    if facts.sequences == 0:
        return np.zeros(0, np.int64)
    mapped = np.memmap(idx_path(facts.prefix), dtype=np.uint8, mode="r")
    lengths = np.frombuffer(mapped, np.int32, facts.sequences, HEADER_BYTES)
    picks = np.unique(np.linspace(0, facts.sequences - 1, EOD_SAMPLES).astype(np.int64))
    picks = picks[lengths[picks] > 0]
    ends = np.cumsum(lengths, dtype=np.int64)[picks] - 1
    data = np.memmap(bin_path(facts.prefix), dtype=facts.dtype, mode="r")
    return np.asarray(data[ends]).astype(np.int64)


def vocabulary_problem(facts: IndexFacts, vocab_size: int, where: str) -> str | None:
    """A bare prefix's ids (bounded scan) against the vocabulary the blend declares."""
    top, seen = largest_id(facts)
    if top < vocab_size:
        return None
    return (f"prefix {facts.prefix} holds token id {top:,} (largest of {seen:,} tokens "
            f"looked at), but {where} vocab_size is {vocab_size:,}; the data was made with a "
            f"larger tokenizer: set vocab_size: {top + 1} or more in the blend (and "
            f"model.vocab_size to match), or prepare the data with this tokenizer")


def manifest_vocabulary_problem(manifest: str, facts: IndexFacts, vocab_size: int,
                                declared: bool = False) -> str | None:
    """A manifest's shard holding an id past the blend's vocabulary: the manifest's own
    vocab_size (prepare_data records its tokenizer's size, so the manifest was edited), or the
    larger one the blend `declared`. Only the bytes the manifest's fingerprint reads anyway
    (`sample_crc32`: SAMPLE_BYTES at each end) are looked at, so it costs no further reading."""
    top, seen = largest_id(facts, SAMPLE_BYTES // np.dtype(facts.dtype).itemsize)
    if top < vocab_size:
        return None
    found = (f"its shard {facts.prefix} holds token id {top:,} (largest of {seen:,} tokens "
             "looked at)")
    if declared:
        return (f"declares vocab_size: {vocab_size} but manifest {manifest}'s data goes past it: "
                f"{found}; set vocab_size: {top + 1} or more (or remove it)")
    return (f"manifest {manifest} says vocab_size {vocab_size:,}, but {found}: the manifest was "
            "edited since scripts/prepare_data.py wrote it; re-run that preparation (it "
            f"rewrites the manifest), or set vocab_size: {top + 1} or more in the blend")


def eod_problem(facts: IndexFacts, eod_id: int) -> str | None:
    """Documents that all end in one id other than `eod_id` were prepared with another EOD."""
    ends = document_ends(facts)
    if ends.size < 2:
        return None
    values, counts = np.unique(ends, return_counts=True)
    common = int(values[np.argmax(counts)])
    if common == eod_id or counts.max() < 0.9 * ends.size:
        return None
    return (f"prefix {facts.prefix}: its documents end in token id {common} ({int(counts.max())} "
            f"of {ends.size} looked at), not eod_id={eod_id}; set eod_id: {common} in the blend, "
            "or name the tokenizer the data was made with")


# ----------------------------------------------------------------------------- tokenizers

TOKENIZER_FILE = "tokenizer.json"  # what a Hugging Face tokenizer directory holds
TOKENIZER_CONFIG = "tokenizer_config.json"  # beside it; names the eos token
# End-of-document tokens of common tokenizers, tried in order when none is configured:
# GPT-2/NeoX/Qwen, Llama 3, Llama 2/Mistral, Gemma.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")


def configured_eos(spec: str) -> str | None:
    """The eos token a Hugging Face folder's tokenizer_config.json names, if any."""
    import json

    path = Path(spec).expanduser()
    config = path / TOKENIZER_CONFIG if path.is_dir() else path.with_name(TOKENIZER_CONFIG)
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def tokenizer_eod(spec: str) -> tuple[int, str] | str:
    """(id, token) of the end-of-document a tokenizer (a folder or its tokenizer.json) names:
    its configured eos token, else the first known end-of-text token; or the problem. Read as
    JSON, without loading the tokenizer."""
    import json

    path = Path(spec).expanduser()
    file = path / TOKENIZER_FILE if path.is_dir() else path
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
        ids = dict(loaded.get("model", {}).get("vocab") or {})
        ids.update({t["content"]: t["id"] for t in loaded.get("added_tokens") or []})
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return f"tokenizer {spec} has no readable {TOKENIZER_FILE}; name a tokenizer folder"
    for token in (configured_eos(spec), *EOD_CANDIDATES):
        if token in ids:
            return int(ids[token]), token
    return f"tokenizer {spec} names no end-of-document token; set eod_id in the blend"

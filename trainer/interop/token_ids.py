"""The special token ids an exported model generates with: end (EOS), start (BOS) and padding.

Why: transformers stops `generate` at `eos_token_id`, read from `generation_config.json`, else
from `config.json`, else from the architecture's class defaults (NemotronH's and Llama's eos 2,
bos 1). A model trained here learned to end a document with the end-of-document id of its
data's tokenizer (0 for the prepared BPEs and the byte corpora), so without these ids a
generation never stops, or stops on an id that means nothing. The ids come from what the run
trained on: the EOD id its checkpoint records (`run.json`'s tokenizer), the BOS and PAD tokens
the shipped tokenizer names; PAD falls back to EOS, as transformers does, so that batched
generation pads with an id the model knows. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _token_text(value: Any) -> str | None:
    """A tokenizer_config.json token: text, or `{"content": text, ...}`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def token_id(tokenizer_dir: Path, token: str | None) -> int | None:
    """The id of `token` in the folder's tokenizer.json (its vocabulary or added tokens)."""
    if token is None:
        return None
    loaded = _read_json(tokenizer_dir / "tokenizer.json")
    for added in loaded.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") == token:
            return int(added["id"])
    vocab = (loaded.get("model") or {}).get("vocab")
    return int(vocab[token]) if isinstance(vocab, dict) and token in vocab else None


def special_ids(eod_id: int, tokenizer_dir: Path | None) -> dict[str, int | None]:
    """bos/eos/pad ids of an exported model: EOS is the run's end-of-document id; BOS and PAD
    the tokens the tokenizer's config names (no BOS: null, which overrides the class default;
    no PAD: the EOS id)."""
    config = _read_json(tokenizer_dir / "tokenizer_config.json") if tokenizer_dir else {}
    bos = token_id(tokenizer_dir, _token_text(config.get("bos_token"))) if tokenizer_dir else None
    pad = token_id(tokenizer_dir, _token_text(config.get("pad_token"))) if tokenizer_dir else None
    return {"bos_token_id": bos, "eos_token_id": eod_id,
            "pad_token_id": eod_id if pad is None else pad}


def generation_config(ids: dict[str, int | None]) -> dict[str, Any]:
    """`generation_config.json`: the ids `generate` reads first."""
    return {key: ids[key] for key in ID_KEYS}

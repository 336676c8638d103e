"""Data blends: which prepared datasets a run trains on, with what weights, and the held-out split.

A blend is environment data, so it lives in `conf/data/<name>.yaml` and a run names it with
`data.blend=conf/data/<name>.yaml`. Megatron Core's own `BlendedMegatronDatasetBuilder` does the
blending; this module only reads and checks the file, before any rank starts:

    train:                                   # weighted sources of training samples
      - {manifest: data_cache/stdlib/stdlib.json, weight: 1.0}   # every shard of a preparation
      - {prefix: /data/web/web_0003, weight: 0.35}               # or one indexed dataset
    valid: [...]                             # optional; otherwise `split` of each train source
    split: [95, 5]                           # train / held-out shares of every train source
    eod_id: 0                                # optional when a manifest names it
    vocab_size: 4096

A manifest is the `<output>.json` that `scripts/prepare_data.py` writes (shards, EOD id, vocab
size). Relative paths are relative to the directory the run starts in. Mistakes (a missing
file or prefix, negative or all-zero weights, manifests that disagree) are one-line
`ConfigError`s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from plugins.protocol.errors import ConfigError


@dataclass(frozen=True)
class BlendSource:
    prefix: str  # an indexed dataset: <prefix>.bin and <prefix>.idx
    weight: float


@dataclass(frozen=True)
class Blend:
    path: str
    train: tuple[BlendSource, ...]
    valid: tuple[BlendSource, ...] | None  # None: held-out samples come from `split`
    split: tuple[float, float]  # train / held-out shares of each train source
    eod_id: int
    vocab_size: int

    def weights(self, sources: tuple[BlendSource, ...]) -> tuple[list[str], list[float]]:
        """Megatron's (prefixes, weights) form of one split."""
        return [s.prefix for s in sources], [s.weight for s in sources]


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"data.blend={path}: {message}")


def _read_yaml(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.blend={path} does not exist; name a blend file, e.g. "
                          "data.blend=conf/data/python_stdlib.yaml")
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        raise _fail(path, "is not valid YAML; fix it (see conf/data/ for examples)") from None
    if not isinstance(loaded, dict) or "train" not in loaded:
        raise _fail(path, "needs a 'train' list of {prefix|manifest, weight} entries")
    return loaded


def _read_manifest(path: str, name: str) -> dict[str, Any]:
    file = Path(name)
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
        manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        raise _fail(path, f"manifest {name} is missing or not a prepare_data manifest; run "
                          "scripts/prepare_data.py or name its <output>.json") from None
    return manifest


def _check_prefix(path: str, prefix: str) -> None:
    missing = [suffix for suffix in (".bin", ".idx") if not Path(prefix + suffix).is_file()]
    if missing:
        raise _fail(path, f"prefix {prefix} has no {' or '.join(prefix + m for m in missing)}; "
                          "prepare it with scripts/prepare_data.py or fix the path")


def _weight(path: str, entry: dict[str, Any]) -> float:
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(
        weight
    ) or weight < 0:
        raise _fail(path, f"weight {weight!r} of {entry} must be a finite number >= 0")
    return float(weight)


def _sources(path: str, entries: Any, facts: list[dict]) -> tuple[BlendSource, ...]:
    """Expand manifests into their shards (weights shared by token count), check prefixes."""
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "'train' and 'valid' must be non-empty lists of "
                          "{prefix|manifest, weight} entries")
    sources: list[BlendSource] = []
    for entry in entries:
        if not isinstance(entry, dict) or ("prefix" in entry) == ("manifest" in entry):
            raise _fail(path, f"entry {entry!r} needs exactly one of 'prefix' or 'manifest'")
        weight = _weight(path, entry)
        if "prefix" in entry:
            sources.append(BlendSource(str(entry["prefix"]), weight))
            continue
        manifest = _read_manifest(path, str(entry["manifest"]))
        facts.append(manifest)
        folder = Path(str(entry["manifest"])).parent
        total = sum(shard["tokens"] for shard in manifest["shards"]) or 1
        for shard in manifest["shards"]:
            share = weight * shard["tokens"] / total
            sources.append(BlendSource(str(folder / shard["prefix"]), share))
    for source in sources:
        _check_prefix(path, source.prefix)
    if sum(s.weight for s in sources) <= 0:
        raise _fail(path, "all weights are zero; give at least one source a positive weight")
    return tuple(sources)


def _token_facts(path: str, loaded: dict[str, Any], facts: list[dict]) -> tuple[int, int]:
    """EOD id and vocabulary size: from the file, else from the manifests (which must agree)."""
    pairs = {(m.get("eod_id"), m.get("vocab_size")) for m in facts}
    if len(pairs) > 1:
        raise _fail(path, f"its manifests disagree on (eod_id, vocab_size): {sorted(pairs)}; "
                          "blend datasets prepared with one tokenizer")
    eod, vocab = pairs.pop() if pairs else (None, None)
    eod, vocab = loaded.get("eod_id", eod), loaded.get("vocab_size", vocab)
    if not isinstance(eod, int) or not isinstance(vocab, int) or not 0 <= eod < vocab:
        raise _fail(path, "needs eod_id and vocab_size (integers, 0 <= eod_id < vocab_size); "
                          "name a manifest or set them in the file")
    return eod, vocab


def _split(path: str, loaded: dict[str, Any]) -> tuple[float, float]:
    split = loaded.get("split", [95, 5])
    ok = isinstance(split, list) and len(split) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in split)
    if not ok or split[0] <= 0 or split[1] <= 0:
        raise _fail(path, f"split {split!r} must be [train, held-out] shares, both > 0, "
                          "e.g. split: [95, 5]")
    return float(split[0]), float(split[1])


def load_blend(path: str) -> Blend:
    """Read and check a blend file (files on disk included); raises a one-line ConfigError."""
    loaded = _read_yaml(path)
    facts: list[dict] = []
    train = _sources(path, loaded["train"], facts)
    valid = _sources(path, loaded["valid"], facts) if loaded.get("valid") is not None else None
    eod, vocab = _token_facts(path, loaded, facts)
    return Blend(path=path, train=train, valid=valid, split=_split(path, loaded), eod_id=eod,
                 vocab_size=vocab)

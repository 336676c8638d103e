"""Data a blend says how to make: prepared once, before the first run that needs it.

A blend file (`conf/data/*.yaml`) may carry a `prepare:` list next to its sources, e.g.

    prepare:
      - {input: python_stdlib, output: data_cache/python_stdlib/stdlib, tokenizer: "train:2048"}

Each entry is a `scripts/prepare_data.py` call. The entry pipeline runs the ones whose manifest
(`<output>.json`) is missing in the launching process, before the paths are checked and before
any rank starts; later runs find the manifest and start at once. `input:` names files as for
prepare_data, or a built-in corpus (`python_stdlib`, `synthetic`), first written as one JSONL
file beside the output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from plugins.protocol.errors import ConfigError
from recipes.config.schema import RunConfig

BUILT_IN_CORPORA = ("python_stdlib", "synthetic")


def _entries(blend_path: str) -> list[dict[str, Any]]:
    try:
        loaded = yaml.safe_load(Path(blend_path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []  # the path rules report an unreadable blend in their own words
    entries = loaded.get("prepare", []) if isinstance(loaded, dict) else []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"data.blend={blend_path}: 'prepare' must be a list of "
                          "{input, output, tokenizer, ...} entries (prepare_data arguments)")
    return entries


def _prepare(entry: dict[str, Any], cfg: RunConfig, blend_path: str) -> None:
    from data_prep.config import parse_args
    from data_prep.corpus import write_corpus_jsonl
    from data_prep.prepare import prepare, print_summary

    arguments = {str(key): str(value) for key, value in entry.items()}
    if arguments.get("input") in BUILT_IN_CORPORA:
        corpus = Path(arguments["output"] + ".corpus.jsonl")
        if not corpus.exists():
            write_corpus_jsonl(arguments["input"], corpus, cfg.data.max_corpus_bytes,
                               cfg.train.seed)
        arguments["input"] = str(corpus)
    try:
        settings = parse_args([f"{key}={value}" for key, value in arguments.items()])
    except ConfigError as error:
        raise ConfigError(f"data.blend={blend_path}: prepare entry {entry}: {error}") from None
    print(f"preparing {settings.output} once for data.blend={blend_path}", flush=True)
    print_summary(prepare(settings))


def pending_preparations(cfg: RunConfig) -> list[tuple[str, dict[str, Any]]]:
    """(blend, entry) for each `prepare:` entry of the run's blend and of every phase's blend
    whose manifest does not exist yet."""
    if cfg.data.source != "blend":
        return []
    blends = [cfg.data.blend, *(phase.blend for phase in cfg.phases)]
    return [(blend, entry) for blend in dict.fromkeys(b for b in blends if b is not None)
            for entry in _entries(blend)
            if entry.get("output") is None or not Path(f"{entry['output']}.json").exists()]


def prepare_missing_data(cfg: RunConfig) -> None:
    """Run the `prepare:` entries whose manifest does not exist yet (`pending_preparations`)."""
    for blend, entry in pending_preparations(cfg):
        _prepare(entry, cfg, blend)

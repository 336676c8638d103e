"""Data a blend says how to make: prepared once, before the first run that needs it.

A blend file (`conf/data/*.yaml`) may carry a `prepare:` list next to its sources, e.g.

    prepare:
      - {input: python_stdlib, output: data_cache/python_stdlib/stdlib, tokenizer: "train:2048"}

Each entry is a `scripts/prepare_data.py` call. The entry pipeline runs the ones whose manifest
(`<output>.json`) is missing in the launching process, before the paths are checked and before
any rank starts; later runs find the manifest and start at once. `input:` names files as for
prepare_data, or a built-in corpus (`python_stdlib`, `synthetic`), first written as one JSONL
file beside the output.

Every entry is checked before any of them runs, and by the blend rules (`check=paths` too):
its keys through prepare_data's own parser (a misspelt `num_shardz` is named with the closest
key, not met after the others have prepared), and its output must make a manifest (or the
datasets of a prefix) the blend's `train:`/`valid:` name: an output the blend does not name
would prepare everything, then train on nothing it made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError, config_error
from recipes.config.blend import blend_document, prepare_entry_name, prepare_list_problem
from recipes.config.blend import prepare_problems as blend_prepare_problems
from recipes.config.schema import RunConfig

BUILT_IN_CORPORA = ("python_stdlib", "synthetic")


def _read_blend(blend_path: str) -> dict[str, Any]:
    loaded = blend_document(blend_path)  # None where unreadable: the path rules say why
    return loaded if isinstance(loaded, dict) else {}


def entry_words(entry: dict[str, Any]) -> list[str]:
    """The prepare_data command line an entry stands for (`key=value` words)."""
    return [f"{key}={value}" for key, value in entry.items()]


def entry_key_problem(index: int, entry: dict[str, Any]) -> str | None:
    """An entry prepare_data's own parser refuses (an unknown or misspelt key, a value of the
    wrong type, a missing input/output/tokenizer), in its words: found before any entry runs,
    not after the entries before it have prepared their data."""
    from data_prep.config import parse_args

    try:
        parse_args(entry_words(entry))
    except ConfigError as error:
        return f"{prepare_entry_name(index, entry)}: {error}"
    return None


def prepare_problems(blend_path: str, loaded: dict[str, Any]) -> list[str]:
    """Every problem of a blend's `prepare:` entries, one line each: the blend's own rules
    (`recipes.config.blend.prepare_problems`: the list's shape, each output named by the
    blend) and each entry's keys and values, through prepare_data's parser."""
    entries = loaded.get("prepare")
    keys = ([entry_key_problem(index, entry) for index, entry in enumerate(entries)]
            if isinstance(entries, list) and prepare_list_problem(entries) is None else [])
    found = [*(problem for problem in keys if problem), *blend_prepare_problems(loaded)]
    return [f"data.blend={blend_path}: {problem}" for problem in found]


def check_prepare_entries(cfg: RunConfig) -> str | None:
    """A path rule (for `check=paths`, which prepares nothing): the first `prepare_problems`
    of the run's blends, or None."""
    return next((problem for blend in run_blends(cfg)
                 for problem in prepare_problems(blend, _read_blend(blend))), None)


def _entries(blend_path: str) -> list[dict[str, Any]]:
    entries = _read_blend(blend_path).get("prepare") or []
    problem = prepare_list_problem(entries)
    if problem:
        raise ConfigError(f"data.blend={blend_path}: {problem}")
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
        settings = parse_args(entry_words(arguments))
    except ConfigError as error:  # prepare_problems found the others before any entry ran
        raise ConfigError(f"data.blend={blend_path}: prepare entry {entry}: {error}") from None
    print(f"preparing {settings.output} once for data.blend={blend_path}", flush=True)
    print_summary(prepare(settings))


def run_blends(cfg: RunConfig) -> list[str]:
    """The blend files of the run and of its phases, each once."""
    if cfg.data.source != "blend":
        return []
    blends = [cfg.data.blend, *(phase.blend for phase in cfg.phases)]
    return list(dict.fromkeys(b for b in blends if b is not None))


def pending_preparations(cfg: RunConfig) -> list[tuple[str, dict[str, Any]]]:
    """(blend, entry) for each `prepare:` entry of the run's blend and of every phase's blend
    whose manifest does not exist yet."""
    return [(blend, entry) for blend in run_blends(cfg) for entry in _entries(blend)
            if entry.get("output") is None or not Path(f"{entry['output']}.json").exists()]


def prepare_missing_data(cfg: RunConfig) -> None:
    """Run the `prepare:` entries whose manifest does not exist yet (`pending_preparations`),
    once every entry of every blend has passed `prepare_problems` (each problem one line)."""
    error = config_error([problem for blend in run_blends(cfg)
                          for problem in prepare_problems(blend, _read_blend(blend))])
    if error is not None:
        raise error
    for blend, entry in pending_preparations(cfg):
        _prepare(entry, cfg, blend)

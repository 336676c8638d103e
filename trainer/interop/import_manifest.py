"""The `run.json` an import writes beside its checkpoint, so the damage check covers it.

Why: pretrain.py (`checkpoint.load=<import>`) and the export check a step against its `run.json`
before anything loads it (`trainer/checkpoint/preflight.py`, `export_step`): a file missing,
cut short or changed since the save is named in one line. An import without one was loaded
unchecked, and a truncated `.distcp` in it ended in `EOFError` tracebacks in every rank. So the
import writes the record a run's save writes (`trainer/checkpoint/publish.py`), in the same
schema (`manifest.py`): the size and CRC-32 of every file it holds (`hf/` included: the export
reads it), the recipe's config and its vocabulary padding (so a run that pads otherwise is
refused before launch, naming the fix), and a one-process layout with no steps taken. It names
no tokenizer: an import's ids are the Hugging Face model's, which a run's prepared data cannot
be compared with, so no tokenizer check applies. The config records `optimizer.fsdp=none`: what
the import wrote is `torch_dist` whatever the recipe trains with (`manifest.format_problem`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipes.config.io import config_dict
from recipes.config.schema import RunConfig
from trainer.checkpoint.format import MANIFEST_FILE, MANIFEST_FORMAT
from trainer.checkpoint.manifest import file_record, layout_record


def file_records(directory: Path) -> dict[str, dict[str, int]]:
    """Size and CRC-32 (`manifest.file_record`) of every file under `directory` but `run.json`,
    by its path inside it (`hf/config.json`), as `manifest.damaged_file` looks them up."""
    return {path.relative_to(directory).as_posix(): file_record(path)
            for path in sorted(Path(directory).rglob("*"))
            if path.is_file() and path.name != MANIFEST_FILE}


def import_manifest(cfg: RunConfig, one: RunConfig, files: dict[str, dict[str, int]],
                    versions: dict[str, str]) -> dict[str, Any]:
    """The import's `run.json` (`publish._manifest`'s fields): recipe `cfg`, written by the one
    process `one` (`megatron_side.one_process`), no step taken, no tokenizer."""
    config = config_dict(cfg)
    config["optimizer"]["fsdp"] = "none"  # the import is torch_dist (module doc)
    return {
        "format": MANIFEST_FORMAT, "step": 0, "consumed_samples": 0, "consumed_tokens": 0,
        "world_size": 1, "layout": layout_record(one.layout),
        "padded_vocab_size": one.layout.padded_vocab, "versions": versions, "tokenizer": None,
        "config": config, "files": dict(sorted(files.items())),
    }


def write_manifest(directory: Path, cfg: RunConfig, one: RunConfig) -> None:
    """`run.json` in `directory` once every other file of the import is written (last)."""
    from trainer.checkpoint.publish import versions  # the versions a run's save records

    manifest = import_manifest(cfg, one, file_records(directory), versions())
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1),
                                                 encoding="utf-8")

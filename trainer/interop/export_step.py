"""The step an export reads: which one a `checkpoint=` names, and whether it is intact.

Why a torch-free module of its own: the export reads the stored tensors through torch DCP,
which meets a truncated or missing file as an `EOFError`, `FileNotFoundError` or
`UnpicklingError` traceback, and a file overwritten in place not at all (it writes an export
full of garbage weights). Every step this project saves, and every import (`importer`), holds
`run.json` with the size and CRC-32 of each file; `manifest.damaged_file` is the check
pretrain.py's pre-flight runs on it before any rank starts (`trainer/checkpoint/preflight.py`).
The export runs that same check, with the same fallback step (`preflight.previous_step`) worded
for its own command line (`checkpoint=`), before torch is imported, so a damaged step is refused
in one line in about a second. Sizes only or CRC-32s too is the saving run's
`checkpoint.verify`, as for pretrain.py. A step without `run.json` (Megatron-LM's or Megatron
Bridge's) is read unchecked, as pretrain.py loads it.
"""

from __future__ import annotations

from pathlib import Path

from plugins.protocol.errors import ConfigError
from trainer.checkpoint.format import is_checkpoint, is_hf_import, newest_checkpoint
from trainer.checkpoint.manifest import damaged_file, read_manifest
from trainer.checkpoint.preflight import previous_step


def resolve_step(path: Path) -> Path:
    """One complete step directory: the one given, or the one a checkpoint root resumes from."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"checkpoint={path} does not exist; give a run's checkpoints "
                          "directory (runs/<run>/checkpoints) or one step directory")
    step = path if is_checkpoint(path) else newest_checkpoint(path)
    if step is None:
        raise ConfigError(f"checkpoint={path} holds no complete Megatron checkpoint; give a run's "
                          "checkpoints directory (runs/<run>/checkpoints) or one step directory")
    return step


def fallback(step: Path) -> str:
    """What to export instead of a damaged step: the previous complete step of its root; for
    an import, the import done again."""
    previous = previous_step(step)
    if previous is not None:
        return (f"export the previous complete checkpoint with checkpoint={previous} (or delete "
                f"{step}: the root then exports it)")
    if is_hf_import(step):
        return ("import the Hugging Face model again (scripts/convert.py import) and export "
                "that")
    return "no earlier complete checkpoint exists; restore the step's files or train again"


def damage_line(given: Path, step: Path, damage: str) -> str:
    """The line an export of a damaged step ends with: what `checkpoint=` named, the damaged
    file in `manifest.damaged_file`'s words, and the fallback."""
    return f"checkpoint={given}: {damage}; {fallback(step)}"


def checksums_wanted(manifest: dict) -> bool:
    """Whether to compare CRC-32s too (the saving run's `checkpoint.verify`: checksum unless it
    said size)."""
    checkpoint = (manifest.get("config") or {}).get("checkpoint") or {}
    return checkpoint.get("verify", "checksum") != "size"


def checked_step(given: Path) -> Path:
    """The step `checkpoint=` names (`resolve_step`), refused in one line when a file differs
    from its `run.json`'s record."""
    step = resolve_step(given)
    manifest = read_manifest(step)
    if manifest is not None:
        damage = damaged_file(step, manifest, checksums_wanted(manifest))
        if damage:
            raise ConfigError(damage_line(given, step, damage))
    return step

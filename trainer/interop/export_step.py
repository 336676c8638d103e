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
`checkpoint.verify`, as for pretrain.py. A `step_NNNNNNN` step without a whole `run.json` was
damaged since its save (the save writes it before the rename): it is refused as the pre-flight
refuses it (`manifest.manifest_problem`), not read unchecked. A step without `run.json` by
design (Megatron-LM's or Megatron Bridge's `iter_NNNNNNN`, an import made before imports wrote
one) is checked as the pre-flight checks it, against the sizes its own DCP index places
(`megatron_lm.unchecked_damage`); bytes changed in place that torch DCP then cannot read are
named at the read site (`region_reader`) in one line, `unreadable_line`.

What is cheap to know is said before torch is imported too: a `.tmp-` directory is a save not
(yet) published, never read (`format.py`); the run's `config.yaml`, which gives the model's
shape, must be found; and when `checkpoint=` is a root, the step it resolves to is named
(`step_line`), as pretrain.py names the step it resumes from.
"""

from __future__ import annotations

from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.io import CONFIG_FILENAME
from trainer.checkpoint.format import (
    CHECKPOINT_MARKER,
    HF_IMPORT_SOURCE,
    MANIFEST_FILE,
    TMP_INFIX,
    is_checkpoint,
    is_hf_import,
    is_project_step,
    latest_name,
    newest_checkpoint,
    tracker_file,
)
from trainer.checkpoint.manifest import (
    damaged_file,
    incompatibility,
    manifest_problem,
    read_manifest,
)
from trainer.checkpoint.megatron_lm import unchecked_damage
from trainer.checkpoint.preflight import previous_step


def unfinished_problem(path: Path) -> str | None:
    """A `.tmp-` directory: a save in progress, or one a crash left, which no reader trusts
    (`format.py`); the step to export instead."""
    if TMP_INFIX not in path.name:
        return None
    newest = newest_checkpoint(path.parent)
    fix = (f"export the newest complete step with checkpoint={newest}, or wait for the save "
           "to finish" if newest is not None else
           "wait for the save to finish (its root holds no complete step yet) or train again")
    return (f"checkpoint={path} is an unfinished save (a {TMP_INFIX} directory: a save in "
            f"progress, or one a crash left); {fix}")


def resolve_step(path: Path) -> Path:
    """One complete step directory: the one given, or the one a checkpoint root resumes from."""
    path = Path(path)
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise ConfigError(f"checkpoint={path} {what}; give a run's checkpoints directory "
                          "(runs/<run>/checkpoints) or one step directory")
    unfinished = unfinished_problem(path)
    if unfinished:
        raise ConfigError(unfinished)
    step = path if is_checkpoint(path) else newest_checkpoint(path)
    if step is None:
        raise ConfigError(f"checkpoint={path} holds no complete Megatron checkpoint; give a run's "
                          "checkpoints directory (runs/<run>/checkpoints) or one step directory")
    return step


def step_line(given: Path, step: Path) -> str | None:
    """The line that names the step a checkpoint root resolved to, and why, when the step its
    `latest` (or Megatron-LM's tracker) names is not complete, an older one is used; None when
    `checkpoint=` named the step itself."""
    given = Path(given)
    if given == step:
        return None
    name = latest_name(given)
    if not name or is_checkpoint(given / name):
        return f"exporting {step}"
    why = ("does not exist" if not (given / name).is_dir() else
           f"has no {CHECKPOINT_MARKER} (an unfinished save?)")
    return (f"exporting {step}: {tracker_file(given)} names {name}, which {why}, so the "
            "newest complete step is used")


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


def unreadable_line(step: Path, file: str | None, reason: str = "cut short or damaged") -> str:
    """The line for a step read unchecked (no `run.json`) whose file torch DCP cannot read:
    the step, the file when known (else its `.distcp` files), and the fallback."""
    return (f"checkpoint {step} cannot be read ({file or 'its .distcp files'}: {reason}); "
            f"{fallback(step)}")


def manifest_refusal(given: Path, step: Path) -> str | None:
    """A step this project saved (`step_NNNNNNN`) whose `run.json` is missing or broken: the
    pre-flight's rule (`manifest.manifest_problem`, for `format.is_project_step` steps), worded
    with the export's fallback."""
    broken = manifest_problem(step) if is_project_step(step) else None
    return damage_line(given, step, broken) if broken else None


def checksums_wanted(manifest: dict) -> bool:
    """Whether to compare CRC-32s too (the saving run's `checkpoint.verify`: checksum unless it
    said size)."""
    checkpoint = (manifest.get("config") or {}).get("checkpoint") or {}
    return checkpoint.get("verify", "checksum") != "size"


def config_file(step: Path) -> Path | None:
    """The run's `config.yaml`: beside the step (an import's), in its root, or in the run
    directory two levels up (`runs/<run>/config.yaml`)."""
    for folder in (step, step.parent, step.parent.parent):
        if (folder / CONFIG_FILENAME).is_file():
            return folder / CONFIG_FILENAME
    return None


def missing_config_line(given: Path, step: Path) -> str:
    """No `config.yaml` to read the model's shape from: where it was looked for, and how to
    write it again (an import: the import again; a run: its recipe's `print=config`)."""
    where = f"no {CONFIG_FILENAME} beside {step} or in its run directory {step.parent.parent}"
    if (step / HF_IMPORT_SOURCE / "config.json").is_file():
        return (f"checkpoint={given}: {where} (an import keeps the recipe's {CONFIG_FILENAME} "
                "in its directory); import the Hugging Face model again (scripts/convert.py "
                "import) and export that")
    recipe = ((read_manifest(step) or {}).get("config") or {}).get("name") or "NAME"
    return (f"checkpoint={given}: {where}, which gives the model's shape; restore the run's "
            f"{CONFIG_FILENAME} there, or write it: python scripts/pretrain.py recipe={recipe} "
            f"<the run's overrides> print=config > {step.parent.parent / CONFIG_FILENAME}")


def checked_step(given: Path) -> Path:
    """The step `checkpoint=` names (`resolve_step`), refused in one line when its `run.json`
    is missing or broken (`manifest_refusal`) or a file differs from its record."""
    step = resolve_step(given)
    refusal = manifest_refusal(given, step)
    if refusal:
        raise ConfigError(refusal)
    manifest = read_manifest(step)
    damage = (damaged_file(step, manifest, checksums_wanted(manifest)) if manifest is not None
              else unchecked_damage(step))  # no run.json: the sizes its DCP index gives
    if damage:
        raise ConfigError(damage_line(given, step, damage))
    return step


def config_mismatch_line(given: Path, step: Path, config_path: Path, cfg) -> str | None:
    """The `config.yaml` found (`config_file`) against the config the step's `run.json`
    recorded at its save: a model of another shape (a hand-edited file, or a run's that is not
    the step's) would export the checkpoint's tensors cut or padded to that shape, silently.
    One line naming both files; None when they agree or the step has no `run.json`."""
    manifest = read_manifest(step)
    reason = incompatibility(cfg, manifest) if manifest is not None else None
    if reason is None:
        return None
    return (f"checkpoint={given}: {config_path} does not describe the model saved in "
            f"{step.name} ({reason.replace('this run has', 'the file has')}); put back the "
            f"run's {CONFIG_FILENAME} (the step's {MANIFEST_FILE} holds the config it was saved "
            "with)")


def run_config_file(given: Path, step: Path) -> Path:
    """The `config.yaml` the export reads the model's shape from (`config_file`), refused in
    one line when there is none (`missing_config_line`)."""
    found = config_file(step)
    if found is None:
        raise ConfigError(missing_config_line(given, step))
    return found

"""A checkpoint on disk: the names of its directories and files, and how the one to resume from is
found. The trainer writes by these names (`save.py`), the path rules and the pre-flight read by
them before any rank starts, without torch (`preflight.py`, `manifest.py`), and the Hugging Face
export finds a run's newest step with them.

    <run_dir>/checkpoints/                 RUN_CHECKPOINTS, a checkpoint root
        step_0000100/                      a published step: STEP_PREFIX + 7 digits
            metadata.json                  CHECKPOINT_MARKER: Megatron's save finished (its
                                           `sharded_backend`: torch_dist, or Megatron FSDP's
                                           fsdp_dtensor, whose marker the trainer writes last)
            run.json                       MANIFEST_FILE: counters, layout, config, file records
            __0_0.distcp, .metadata, ...   Megatron's own files (fsdp_dtensor: torch DCP's, and
                                           run_state.pt, __<rank>_rng.pt: `fsdp_dtensor.py`)
        step_0000200.tmp-200-1a2b3c4d/     a save in progress (or one a crash left): TMP_INFIX
        latest                             LATEST_FILE: the newest published step's name

A Hugging Face import (`scripts/convert.py import`, `trainer/interop/importer.py`) is one step
directory of any name with Megatron's files, the recipe it was converted for (IMPORT_CONFIG)
and the source's `hf/config.json` (HF_IMPORT_SOURCE): weights only, no step or optimizer.

A save is written under its `.tmp-` name and renamed once every rank has finished; `latest` is
replaced last. A reader therefore trusts only published steps that hold the marker: the step
`latest` names when it is one, else the newest such step. A published step that would be that
step but cannot be read, or holds `run.json` without the marker (written before the rename, so
lost since), is damage (`damaged_newest`): refused by the pre-flight, never passed over.

The second layout is Megatron-LM's (`--save DIR`, `megatron/training/checkpointing.py:195-241,
340-343`), which Megatron Bridge writes too, and which this project writes with
`checkpoint.format=megatron_lm`:

    DIR/latest_checkpointed_iteration.txt  MEGATRON_LM_TRACKER: the newest iteration (or release)
    DIR/iter_0000100/                      ITER_PREFIX + 7 digits, the same torch_dist files
        train_state.pt, run_config.yaml    Megatron Bridge's counters and config (BRIDGE_*)
    DIR/release/                           RELEASE_DIR: weights published without a step

Both layouts are recognised everywhere a step is looked for: `step_of` reads either name, a root
resumes from what `latest` names, else what the tracker names, else its newest complete step
(said in one `resume:` line, `fallback_note`, when either file names something else).
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKPOINT_MARKER = "metadata.json"  # written by megatron.core.dist_checkpointing when done
LATEST_FILE = "latest"  # a run's checkpoint root names its newest step directory here
RUN_CHECKPOINTS = "checkpoints"  # where a run directory keeps its checkpoints
STEP_PREFIX = "step_"  # step_NNNNNNN: a published checkpoint
TMP_INFIX = ".tmp-"  # step_NNNNNNN.tmp-<token>: a save in progress (or one a crash left)
MANIFEST_FILE = "run.json"  # what the run says about itself, beside Megatron's files
MANIFEST_FORMAT = 1
DCP_METADATA = ".metadata"  # torch DCP's index of every saved item (offsets in the .distcp files)
# Megatron-LM's layout (checkpoint.format=megatron_lm writes it; Megatron Bridge writes it too)
MEGATRON_LM_FORMAT = "megatron_lm"
MEGATRON_LM_TRACKER = "latest_checkpointed_iteration.txt"
ITER_PREFIX = "iter_"  # iter_NNNNNNN: Megatron-LM's step directory
RELEASE_DIR = "release"  # Megatron-LM's published weights, without step or optimizer
BRIDGE_TRAIN_STATE = "train_state.pt"  # Megatron Bridge: step, consumed samples (torch.save)
BRIDGE_RUN_CONFIG = "run_config.yaml"  # Megatron Bridge: the run's whole config
# A Hugging Face import's own files (trainer/interop/importer.py writes them): its config
# (`save_config`) and the source's config.json and tokenizer files in the `hf/` folder.
IMPORT_CONFIG = "config.yaml"
HF_IMPORT_SOURCE = "hf"
LEGACY_PREFIX = "mp_rank_"  # Megatron-LM's older `torch` format: one file per model-parallel rank
PREFIXES = (STEP_PREFIX, ITER_PREFIX)
# The backends a checkpoint's marker names (`metadata.json`'s `sharded_backend`): Megatron's
# sharded state dicts, or Megatron FSDP's DTensors through torch DCP.
TORCH_DIST = "torch_dist"
FSDP_DTENSOR = "fsdp_dtensor"


def step_name(step: int, layout: str = "") -> str:
    """The published directory name of the checkpoint after `step` optimizer steps (Megatron-LM's
    `iter_NNNNNNN` for `checkpoint.format=megatron_lm`)."""
    prefix = ITER_PREFIX if layout == MEGATRON_LM_FORMAT else STEP_PREFIX
    return f"{prefix}{step:07d}"


def is_checkpoint(path: Path) -> bool:
    """A finished Megatron checkpoint: its save got as far as writing `metadata.json` (False
    where that cannot be told: a directory this user may not enter, `step_damage` says so)."""
    try:
        return (path / CHECKPOINT_MARKER).is_file()
    except OSError:
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def readable(path: Path) -> bool:
    """Whether this process can read `path`: list a directory, open a file (False only for a
    refusal by permissions; a path that is gone is `missing`'s business elsewhere)."""
    try:
        if path.is_dir():
            with os.scandir(path):
                pass
        else:
            with open(path, "rb"):
                pass
    except PermissionError:
        return False
    except OSError:
        return True
    return True


def _owner(path: Path) -> str:
    """`its owner (name)`, as far as the file's owner can be told."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "its owner"
    try:
        import pwd

        return f"its owner ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"its owner (uid {uid})"


def unreadable_text(path: Path, shown: str) -> str:
    """The damage clause for a file or step directory this user may not read: the file, the
    cause and both fixes (run as its owner, or let this user read it)."""
    mode = "-R a+rX" if _is_dir(path) else "a+r"
    return (f"{shown} is not readable (permissions): run as {_owner(path)} or make it "
            f"readable with chmod {mode} {path}")


def lost_marker(path: Path) -> bool:
    """A published step (`step_NNNNNNN`/`iter_NNNNNNN`, no `.tmp-`) that holds this project's
    `run.json` but no `metadata.json`: both are written before the rename that publishes a
    step, so the marker was lost since (not a save still in progress). Megatron-LM's own
    `iter_` steps (no `run.json`) may be unfinished and are not this."""
    if step_of(path.name) is None:
        return False
    try:
        return (path / MANIFEST_FILE).is_file() and not (path / CHECKPOINT_MARKER).is_file()
    except OSError:
        return False


def step_damage(path: Path) -> str | None:
    """Why a published step directory cannot be resumed from although it looks published: it
    cannot be read (permissions), or it lost its `metadata.json` (`lost_marker`); None for a
    whole step, an unfinished Megatron-LM `iter_` and anything that is no step directory."""
    if (step_of(path.name) is None and path.name != RELEASE_DIR) or not _is_dir(path):
        return None
    if not readable(path):
        return unreadable_text(path, path.name)
    if lost_marker(path):
        return (f"{path.name}/{CHECKPOINT_MARKER} is missing (every published step has one: it "
                "is written before the rename that publishes the step)")
    return None


def unreadable_file(step_dir: Path) -> Path | None:
    """The first file directly in a step directory that this user may not read (for a step
    without `run.json`, whose files `manifest.damaged_file` does not list); None when all are
    readable or the directory cannot be listed (`step_damage` says that)."""
    try:
        files = sorted(p for p in step_dir.iterdir() if p.is_file())
    except OSError:
        return None
    return next((path for path in files if not readable(path)), None)


def is_project_step(path: Path) -> bool:
    """A published step this project's own layout names (`step_NNNNNNN`): it always holds a
    `run.json` (Megatron-LM's `iter_NNNNNNN` and an import do not)."""
    return path.name.startswith(STEP_PREFIX) and step_of(path.name) is not None


def is_hf_import(path: Path) -> bool:
    """A Hugging Face import: the recipe's config and the source's config.json beside
    Megatron's files (a run's steps hold neither)."""
    try:
        return ((path / IMPORT_CONFIG).is_file()
                and (path / HF_IMPORT_SOURCE / "config.json").is_file())
    except OSError:  # a directory this user may not enter (`step_damage` says so)
        return False


def format_of(cfg) -> str:
    """The format a run saves in: Megatron FSDP's DTensors need `fsdp_dtensor` (Megatron-LM
    saves Megatron FSDP only so, `megatron/training/arguments.py:1146-1147`), else
    `torch_dist`."""
    return FSDP_DTENSOR if cfg.optimizer.fsdp != "none" else TORCH_DIST


def checkpoint_backend(path: Path) -> str | None:
    """The format a finished checkpoint was written in (`torch_dist` or `fsdp_dtensor`), from
    its marker; None when it cannot be read."""
    import json

    try:
        backend = json.loads((path / CHECKPOINT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return backend.get("sharded_backend") if isinstance(backend, dict) else None


def step_of(name: str) -> int | None:
    """The step of a published `step_NNNNNNN` or `iter_NNNNNNN` name (None for anything else,
    `.tmp-` included)."""
    for prefix in PREFIXES:
        digits = name[len(prefix):]
        if name.startswith(prefix) and digits.isdigit():
            return int(digits)
    return None


def published_steps(root: Path) -> list[Path]:
    """Every published step directory under a checkpoint root (its name a step's, no `.tmp-`),
    whole or not, oldest first."""
    try:
        found = [(step_of(p.name), p) for prefix in PREFIXES for p in root.glob(f"{prefix}*")
                 if step_of(p.name) is not None and _is_dir(p)]
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def complete_steps(root: Path) -> list[Path]:
    """The finished, published step directories under a checkpoint root, oldest first."""
    return [p for p in published_steps(root) if is_checkpoint(p)]


def unfinished_saves(root: Path) -> list[Path]:
    """`.tmp-` step directories: saves in progress, or what a crashed save left."""
    try:
        return sorted(p for prefix in PREFIXES for p in root.glob(f"{prefix}*{TMP_INFIX}*")
                      if _is_dir(p))
    except OSError:
        return []


def step_of_unfinished(path: Path) -> int | None:
    """The step an unfinished save was writing (`step_NNNNNNN.tmp-...` -> NNNNNNN)."""
    return step_of(path.name.split(TMP_INFIX)[0])


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def tracker_name(root: Path) -> str | None:
    """The directory Megatron-LM's tracker names: `iter_NNNNNNN` for an iteration, `release`;
    None without a readable tracker, '' for one that names neither."""
    text = _read(root / MEGATRON_LM_TRACKER)
    if text is None:
        return None
    if text == RELEASE_DIR:
        return RELEASE_DIR
    return step_name(int(text), MEGATRON_LM_FORMAT) if text.isdigit() else ""


def tracker_file(root: Path) -> str:
    """The file that names a root's newest step: ours (`latest`) or Megatron-LM's tracker."""
    return LATEST_FILE if (root / LATEST_FILE).exists() else MEGATRON_LM_TRACKER


def latest_name(root: Path) -> str | None:
    """What the root's `latest` file says, else what Megatron-LM's tracker names (None when
    neither can be read)."""
    if (root / LATEST_FILE).exists():
        return _read(root / LATEST_FILE)
    return tracker_name(root)


def is_release(path: Path) -> bool:
    """Megatron-LM's `release` directory: weights without a step or optimizer state."""
    return path.name == RELEASE_DIR


def _pick(root: Path, usable) -> Path | None:
    """The step `newest_checkpoint` picks among the directories `usable` accepts."""
    named = [root / name for name in (_read(root / LATEST_FILE), tracker_name(root))
             if name and (step_of(name) is not None or name == RELEASE_DIR)
             and usable(root / name)]
    if named:  # both: the newer (Megatron-LM may have gone on saving into a root of ours)
        return max(named, key=lambda path: step_of(path.name) or -1)
    steps = [p for p in published_steps(root) if usable(p)]
    return steps[-1] if steps else None


def newest_checkpoint(root: Path) -> Path | None:
    """The step a checkpoint root resumes from: the one `latest` or Megatron-LM's tracker names
    when it is a complete step directory (or `release`; the newer when both do), else the newest
    complete one (`latest` not yet replaced, or naming a step gone); None when the root holds
    no complete step. A damaged step it passes over is `damaged_newest`'s."""
    return _pick(root, is_checkpoint)


def damaged_newest(root: Path) -> Path | None:
    """The published step a resume from `root` would pick were its damaged steps whole, when
    that step is damaged (`step_damage`: unreadable, or its `metadata.json` lost): refused with
    the damage named, never passed over for an older step or a fresh start. None otherwise."""
    pick = _pick(root, lambda path: is_checkpoint(path) or step_damage(path) is not None)
    return pick if pick is not None and step_damage(pick) is not None else None


def fallback_note(root: Path) -> str | None:
    """The line a resume prints when a root's `latest` file or Megatron-LM's tracker names no
    complete step (a step gone or unfinished, or text that is no step: `abc`), so the root
    resumes from its newest complete one (`newest_checkpoint`) instead; None when the step
    resumed from is the one named, or the root has neither file or no complete step."""
    step = newest_checkpoint(root)
    files = [name for name in (LATEST_FILE, MEGATRON_LM_TRACKER) if (root / name).exists()]
    if step is None or not files:
        return None
    named = {_read(root / name) if name == LATEST_FILE else tracker_name(root) for name in files}
    if step.name in named:
        return None
    said = [f"{name} names {text[:60]!r}" if text is not None else f"{name} cannot be read"
            for name, text in ((name, _read(root / name)) for name in files)]
    return (f"{' and '.join(said)}, no complete step; resuming from the newest complete one, "
            f"{step.name}")

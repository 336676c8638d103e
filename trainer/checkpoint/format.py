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

A save is written under its `.tmp-` name and renamed once every rank has finished; `latest` is
replaced last. A reader therefore trusts only published steps that hold the marker: the step
`latest` names when it is one, else the newest such step.
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_MARKER = "metadata.json"  # written by megatron.core.dist_checkpointing when done
LATEST_FILE = "latest"  # a run's checkpoint root names its newest step directory here
RUN_CHECKPOINTS = "checkpoints"  # where a run directory keeps its checkpoints
STEP_PREFIX = "step_"  # step_NNNNNNN: a published checkpoint
TMP_INFIX = ".tmp-"  # step_NNNNNNN.tmp-<token>: a save in progress (or one a crash left)
MANIFEST_FILE = "run.json"  # what the run says about itself, beside Megatron's files
MANIFEST_FORMAT = 1
# The backends a checkpoint's marker names (`metadata.json`'s `sharded_backend`): Megatron's
# sharded state dicts, or Megatron FSDP's DTensors through torch DCP.
TORCH_DIST = "torch_dist"
FSDP_DTENSOR = "fsdp_dtensor"


def step_name(step: int) -> str:
    """The published directory name of the checkpoint after `step` optimizer steps."""
    return f"{STEP_PREFIX}{step:07d}"


def is_checkpoint(path: Path) -> bool:
    """A finished Megatron checkpoint: its save got as far as writing `metadata.json`."""
    return (path / CHECKPOINT_MARKER).is_file()


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
    """The step of a published `step_NNNNNNN` name (None for anything else, `.tmp-` included)."""
    digits = name[len(STEP_PREFIX):]
    return int(digits) if name.startswith(STEP_PREFIX) and digits.isdigit() else None


def complete_steps(root: Path) -> list[Path]:
    """The finished, published step directories under a checkpoint root, oldest first."""
    found = [
        (step_of(p.name), p) for p in root.glob(f"{STEP_PREFIX}*")
        if step_of(p.name) is not None and p.is_dir() and is_checkpoint(p)
    ]
    return [p for _, p in sorted(found)]


def unfinished_saves(root: Path) -> list[Path]:
    """`.tmp-` step directories: saves in progress, or what a crashed save left."""
    return sorted(p for p in root.glob(f"{STEP_PREFIX}*{TMP_INFIX}*") if p.is_dir())


def step_of_unfinished(path: Path) -> int | None:
    """The step an unfinished save was writing (`step_NNNNNNN.tmp-...` -> NNNNNNN)."""
    return step_of(path.name.split(TMP_INFIX)[0])


def latest_name(root: Path) -> str | None:
    """What the root's `latest` file says (None when it cannot be read)."""
    try:
        return (root / LATEST_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def newest_checkpoint(root: Path) -> Path | None:
    """The step a checkpoint root resumes from: the one `latest` names when it is a complete
    step directory, else the newest complete one (a crash between rename and marker, or a lost
    marker); None when the root holds no complete step."""
    name = latest_name(root)
    if name and step_of(name) is not None and is_checkpoint(root / name):
        return root / name
    steps = complete_steps(root)
    return steps[-1] if steps else None

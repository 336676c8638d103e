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
`latest` names when it is one, else the newest such step.

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
    """A finished Megatron checkpoint: its save got as far as writing `metadata.json`."""
    return (path / CHECKPOINT_MARKER).is_file()


def is_project_step(path: Path) -> bool:
    """A published step this project's own layout names (`step_NNNNNNN`): it always holds a
    `run.json` (Megatron-LM's `iter_NNNNNNN` and an import do not)."""
    return path.name.startswith(STEP_PREFIX) and step_of(path.name) is not None


def is_hf_import(path: Path) -> bool:
    """A Hugging Face import: the recipe's config and the source's config.json beside
    Megatron's files (a run's steps hold neither)."""
    return ((path / IMPORT_CONFIG).is_file()
            and (path / HF_IMPORT_SOURCE / "config.json").is_file())


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


def complete_steps(root: Path) -> list[Path]:
    """The finished, published step directories under a checkpoint root, oldest first."""
    found = [
        (step_of(p.name), p) for prefix in PREFIXES for p in root.glob(f"{prefix}*")
        if step_of(p.name) is not None and p.is_dir() and is_checkpoint(p)
    ]
    return [p for _, p in sorted(found)]


def unfinished_saves(root: Path) -> list[Path]:
    """`.tmp-` step directories: saves in progress, or what a crashed save left."""
    return sorted(p for prefix in PREFIXES for p in root.glob(f"{prefix}*{TMP_INFIX}*")
                  if p.is_dir())


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


def newest_checkpoint(root: Path) -> Path | None:
    """The step a checkpoint root resumes from: the one `latest` or Megatron-LM's tracker names
    when it is a complete step directory (or `release`; the newer when both do), else the newest
    complete one (a crash between rename and marker, or a lost marker); None when the root holds
    no complete step."""
    named = [root / name for name in (_read(root / LATEST_FILE), tracker_name(root))
             if name and (step_of(name) is not None or name == RELEASE_DIR)
             and is_checkpoint(root / name)]
    if named:  # both: the newer (Megatron-LM may have gone on saving into a root of ours)
        return max(named, key=lambda path: step_of(path.name) or -1)
    steps = complete_steps(root)
    return steps[-1] if steps else None


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

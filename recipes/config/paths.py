"""Checks the paths a configuration names, in the launching process, before any rank starts.

A checkpoint path that is wrong, or an output directory that cannot be written, otherwise shows
up minutes later as a traceback in every rank (after process groups, model build and Megatron's
own checks). These rules look at the filesystem, so they are kept apart from the pure rules of
`validation.py`; each still returns None or the one line naming the field, its value and the fix.
A dry run reads and writes no files, so it skips them (its checkpoint may live on the cluster).

What a checkpoint looks like (see `trainer/checkpointing.py`): Megatron's `torch_dist` format
writes `metadata.json` into the checkpoint directory when a save finishes; a run keeps its
checkpoints in `<run_dir>/checkpoints/step_NNNNNNN/` with a `latest` file naming the newest one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from recipes.config.blend import load_blend
from recipes.config.errors import ConfigError
from recipes.config.schema import RunConfig

CHECKPOINT_MARKER = "metadata.json"  # written by megatron.core.dist_checkpointing when done
LATEST_FILE = "latest"  # a run's checkpoint root names its newest step directory here
RUN_CHECKPOINTS = "checkpoints"  # where a run directory keeps its checkpoints
CHECKPOINT_EXAMPLE = "runs/<run>/checkpoints"


def _is_checkpoint(path: Path) -> bool:
    return (path / CHECKPOINT_MARKER).is_file()


def _complete_steps(root: Path) -> list[str]:
    """Names of the finished step directories under a checkpoint root, oldest first."""
    return sorted(p.name for p in root.glob("step_*") if p.is_dir() and _is_checkpoint(p))


def _latest_problem(load: str, root: Path) -> str | None:
    """A checkpoint root whose `latest` file must name a finished step directory."""
    try:
        step = (root / LATEST_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or "not text"
        return (
            f"checkpoint.load={load}: its {LATEST_FILE} file cannot be read ({reason}); fix it "
            "or point checkpoint.load at one step directory"
        )
    steps = _complete_steps(root)
    fix = (
        f"point checkpoint.load at a finished step, e.g. checkpoint.load={root / steps[-1]}"
        if steps
        else "point checkpoint.load at another checkpoint or set checkpoint.load=null"
    )
    if not step or "/" in step or step in (".", ".."):
        return f"checkpoint.load={load}: its {LATEST_FILE} file names no step ('{step}'); {fix}"
    if not (root / step).is_dir():
        return (
            f"checkpoint.load={load}: {LATEST_FILE} names {step}, but {root / step} does not "
            f"exist; {fix}"
        )
    if not _is_checkpoint(root / step):
        return (
            f"checkpoint.load={load}: {LATEST_FILE} names {step}, but {root / step} has no "
            f"{CHECKPOINT_MARKER} (an unfinished save?); {fix}"
        )
    return None


def _not_a_checkpoint_message(load: str, path: Path) -> str:
    """A directory that is neither a checkpoint nor a checkpoint root: say where one might be."""
    if (path / RUN_CHECKPOINTS).is_dir():
        return (
            f"checkpoint.load={load} is a run directory, not a checkpoint; set "
            f"checkpoint.load={path / RUN_CHECKPOINTS}"
        )
    steps = _complete_steps(path)
    if steps:
        return (
            f"checkpoint.load={load} has no {LATEST_FILE} file; point it at one of its steps, "
            f"e.g. checkpoint.load={path / steps[-1]}"
        )
    return (
        f"checkpoint.load={load} is not a Megatron checkpoint (no {CHECKPOINT_MARKER} and no "
        f"{LATEST_FILE} file); point it at a saved checkpoint, e.g. "
        f"checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
    )


def check_checkpoint_load_path(cfg: RunConfig) -> str | None:
    """`checkpoint.load` is a finished checkpoint or a run's checkpoint root (`latest`)."""
    load = cfg.checkpoint.load
    if load is None or not load.strip():
        return None  # empty text is `check_empty_strings`'s message
    path = Path(load)
    tilde = " (~ is not expanded; write the full path)" if load.startswith("~") else ""
    if not path.exists():
        return (
            f"checkpoint.load={load} does not exist{tilde}; point it at a saved checkpoint, "
            f"e.g. checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
        )
    if not path.is_dir():
        holder = path.parent if path.name in (CHECKPOINT_MARKER, LATEST_FILE) else None
        fix = f"checkpoint.load={holder}" if holder else f"checkpoint.load={CHECKPOINT_EXAMPLE}"
        return f"checkpoint.load={load} is a file, not a checkpoint directory; set {fix}"
    try:
        empty = next(path.iterdir(), None) is None
    except OSError as err:
        return (
            f"checkpoint.load={load} cannot be read ({err.strerror}); fix its permissions or "
            "point checkpoint.load elsewhere"
        )
    if empty:
        return (
            f"checkpoint.load={load} is an empty directory; point it at a saved checkpoint, "
            f"e.g. checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
        )
    if (path / LATEST_FILE).exists():
        return _latest_problem(load, path)
    if not _is_checkpoint(path):
        return _not_a_checkpoint_message(load, path)
    return None


def directory_problem(key: str, value: str, fix: str) -> str | None:
    """`value` is a directory, or can be created: its nearest existing parent is a writable
    directory. `fix` ends the message (what to set instead)."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        return f"{key}={value} is a file, not a directory; {fix}"
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{key}={value} cannot be created: {existing} is a file; {fix}"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path.absolute() else f"its parent {existing}"
        return f"{key}={value} cannot be written ({where} is not writable by this user); {fix}"
    return None


def check_output_dir(cfg: RunConfig) -> str | None:
    """Runs are written under `output_dir` (unless `run_dir` is given)."""
    if cfg.run_dir is not None or not cfg.output_dir.strip():
        return None
    fix = f"set output_dir to a writable directory, e.g. output_dir={Path.home() / 'runs'}"
    return directory_problem("output_dir", cfg.output_dir, fix)


def check_run_dir(cfg: RunConfig) -> str | None:
    """An explicit `run_dir` is the run's directory itself."""
    if cfg.run_dir is None or not cfg.run_dir.strip():
        return None
    fix = "set run_dir to a writable directory, or run_dir=null to make one under output_dir"
    return directory_problem("run_dir", cfg.run_dir, fix)


PathRule = Callable[[RunConfig], str | None]



def check_data_blend(cfg: RunConfig) -> str | None:
    """The blend file, its prefixes and manifests exist; its vocabulary fits the model."""
    if cfg.data.source != "blend" or cfg.data.blend is None:
        return None
    try:
        blend = load_blend(cfg.data.blend)
    except ConfigError as error:
        return str(error)
    weights = {source.weight for source in blend.train} - {0.0}
    if cfg.data.documents == "packed" and len(weights) > 1:
        return (f"data.blend={cfg.data.blend} weights its sources, but data.documents=packed "
                "trains on every pack of every source once; give the sources equal weights, or "
                "use data.documents=inter_document to keep the weights")
    if blend.vocab_size > cfg.model.vocab_size:
        return (f"data.blend={cfg.data.blend} holds token ids up to {blend.vocab_size - 1}, but "
                f"model.vocab_size={cfg.model.vocab_size}; set model.vocab_size={blend.vocab_size}")
    return None


PATH_RULES: tuple[PathRule, ...] = (
    check_output_dir, check_run_dir, check_checkpoint_load_path, check_data_blend,
)


def validate_paths(cfg: RunConfig) -> None:
    """Raise `ConfigError` with the first path problem (none for a dry run, which uses no files)."""
    if cfg.dry_run:
        return
    for rule in PATH_RULES:
        message = rule(cfg)
        if message:
            raise ConfigError(message)

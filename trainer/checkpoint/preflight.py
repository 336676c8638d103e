"""The checkpoint a run names, checked in the launching process before any rank starts (and
before torch is imported: this module, `format.py` and `manifest.py` are torch-free).

A checkpoint path that is wrong otherwise shows up minutes later as a traceback in every rank
(after process groups, model build and Megatron's own checks). Each rule returns None or the one
line naming the field, its value and the fix. A dry run reads and writes no files, so it skips
them (its checkpoint may live on the cluster).

A crash leaves at most a `.tmp-` directory (ignored here) or a `latest` naming a directory that
is gone (`format.py`); the root then resumes from its newest complete step, and only a root
with no complete step at all is an error. The checkpoint's own `run.json` is then checked
(`manifest.py`): damage, a model that cannot load it, a layout its optimizer state cannot
reshard to, and what a resume changes.

`checkpoint.resume=true` (what a requeued Slurm job runs with) is resolved here as well, first:
it becomes `checkpoint.load=<run_dir>/checkpoints` when that root holds a complete step, or a
fresh start, said in one line, when it does not (a first attempt, or one that stopped before its
first save). `validate_paths` is the first step of every entry point that reads the filesystem,
in the launching process and on each rank of an outside launch: it resolves the resume, then
runs recipes/'s path rules with the checkpoint rule in its place among them, so a resume meets
every check and pre-flight a `checkpoint.load` meets, and the ranks and the run's `config.yaml`
see a plain `checkpoint.load`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.io import CONFIG_FILENAME
from recipes.config.path_rules import (
    DIRECTORY_RULES,
    INPUT_RULES,
    PathRule,
    check_run_dir,
)
from recipes.config.schema import RunConfig
from trainer.checkpoint.format import (
    CHECKPOINT_MARKER,
    LATEST_FILE,
    RUN_CHECKPOINTS,
    complete_steps,
    is_checkpoint,
    latest_name,
    newest_checkpoint,
    step_of,
    unfinished_saves,
)
from trainer.checkpoint.manifest import (
    damaged_file,
    format_problem,
    incompatibility,
    read_manifest,
    reshard_problem,
    resume_notes,
)

CHECKPOINT_EXAMPLE = "runs/<run>/checkpoints"


def _no_complete_step_message(load: str, root: Path) -> str:
    """A checkpoint root (a `latest` file or step directories) with no step to resume from."""
    fix = "point checkpoint.load at another checkpoint or set checkpoint.load=null"
    name = latest_name(root)
    if (root / LATEST_FILE).exists() and not name:
        what = "names no step ('')" if name == "" else "cannot be read"
        return f"checkpoint.load={load}: its {LATEST_FILE} file {what}; {fix}"
    if name and not (root / name).is_dir():
        return (f"checkpoint.load={load}: {LATEST_FILE} names {name}, but {root / name} does not "
                f"exist and no other step is complete; {fix}")
    if name:
        return (f"checkpoint.load={load}: {LATEST_FILE} names {name}, but {root / name} has no "
                f"{CHECKPOINT_MARKER} (an unfinished save?) and no other step is complete; {fix}")
    unfinished = [p.name for p in unfinished_saves(root)]
    return (f"checkpoint.load={load} holds no complete checkpoint, only unfinished saves "
            f"({', '.join(unfinished)}); {fix}")


def _not_a_checkpoint_message(load: str, path: Path) -> str:
    """A directory that is neither a checkpoint nor a checkpoint root: say where one might be."""
    if (path / RUN_CHECKPOINTS).is_dir():
        return (
            f"checkpoint.load={load} is a run directory, not a checkpoint; set "
            f"checkpoint.load={path / RUN_CHECKPOINTS}"
        )
    return (
        f"checkpoint.load={load} is not a Megatron checkpoint (no {CHECKPOINT_MARKER} and no "
        f"{LATEST_FILE} file); point it at a saved checkpoint, e.g. "
        f"checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
    )


def _directory_problem(load: str, path: Path) -> str | None:
    """A `checkpoint.load` directory: one checkpoint, or a root with a complete step."""
    if is_checkpoint(path) or newest_checkpoint(path) is not None:
        return None
    if (path / LATEST_FILE).exists() or unfinished_saves(path):
        return _no_complete_step_message(load, path)
    return _not_a_checkpoint_message(load, path)


def check_checkpoint_load_path(cfg: RunConfig) -> str | None:
    """`checkpoint.load` is a finished checkpoint or a checkpoint root with a complete step."""
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
    return _directory_problem(load, path)


def loaded_step(load: str) -> Path | None:
    """The step directory `checkpoint.load` names or resumes from (None: no complete step)."""
    path = Path(load)
    return path if is_checkpoint(path) else newest_checkpoint(path)


def resumed_step(cfg: RunConfig) -> int:
    """The step a run continues from: its checkpoint's saved step on a full resume (run.json,
    else the step directory's name), else 0."""
    load = cfg.checkpoint.load
    if load is None or cfg.checkpoint.load_model_only or not Path(load).exists():
        return 0
    step_dir = loaded_step(load)
    if step_dir is None:
        return 0
    manifest = read_manifest(step_dir)
    if manifest is not None and isinstance(manifest.get("step"), int):
        return manifest["step"]
    return step_of(step_dir.name) or 0


def previous_step(step_dir: Path) -> Path | None:
    """The newest complete step before `step_dir` in its checkpoint root."""
    step = step_of(step_dir.name)
    earlier = [p for p in complete_steps(step_dir.parent)
               if step is not None and step_of(p.name) < step]
    return earlier[-1] if earlier else None


def _damage_message(load: str, step_dir: Path, damage: str) -> str:
    previous = previous_step(step_dir)
    if previous is None:
        fallback = "no earlier complete checkpoint exists; start without checkpoint.load"
    else:
        fallback = (f"fall back to the previous complete checkpoint with checkpoint.load="
                    f"{previous} (or delete {step_dir}: the root then resumes from it)")
    return f"checkpoint.load={load}: {damage}; {fallback}"


def checkpoint_preflight(cfg: RunConfig) -> list[str]:
    """The checkpoint a run loads, checked against its `run.json` before any rank starts:
    a damaged file or a model that cannot load it raises `ConfigError` (one line); returns the
    lines that say what a full resume continues from and what it changes."""
    load = cfg.checkpoint.load
    if cfg.dry_run or load is None or check_checkpoint_load_path(cfg) is not None:
        return []
    step_dir = loaded_step(load)
    manifest = read_manifest(step_dir) if step_dir is not None else None
    if manifest is None:  # written by another tool: Megatron's own checks apply at load
        return []
    damage = damaged_file(step_dir, manifest, cfg.checkpoint.verify == "checksum")
    if damage:
        raise ConfigError(_damage_message(load, step_dir, damage))
    reason = incompatibility(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} does not fit this run's model: {reason}; "
                          "use the saved value, or start from another checkpoint")
    reason = format_problem(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} cannot be loaded by this run: {reason}")
    reason = reshard_problem(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} cannot resume in this layout: {reason}")
    return [] if cfg.checkpoint.load_model_only else resume_notes(cfg, step_dir, manifest)



def _fresh_start_note(cfg: RunConfig, run_dir: Path) -> str:
    if (run_dir / CONFIG_FILENAME).is_file():
        return (f"run_dir={cfg.run_dir} has a {CONFIG_FILENAME} but no complete checkpoint in "
                f"{run_dir / RUN_CHECKPOINTS} (the last start stopped before its first save); "
                "starting again from step 0")
    return f"run_dir={cfg.run_dir} holds no checkpoint yet; starting from step 0"


def resolve_resume(cfg: RunConfig) -> tuple[RunConfig, str | None]:
    """`checkpoint.resume=true` as what it means for this start: `checkpoint.load=<run_dir>/
    checkpoints` when that root holds a complete step (Megatron-LM's `--load` = `--save`), else
    a fresh start and the line that says so. The result has `resume` off, so it is a plain
    config to every later check, to the ranks and in the run's config.yaml. Returned unchanged
    when resume is off or a rule about it is broken (that rule's message comes first)."""
    checkpoint = cfg.checkpoint
    if not checkpoint.resume or checkpoint.load is not None or not cfg.run_dir:
        return cfg, None
    if check_run_dir(cfg) is not None:
        return cfg, None
    run_dir = Path(cfg.run_dir).resolve()
    root = run_dir / RUN_CHECKPOINTS
    if root.is_dir() and newest_checkpoint(root) is not None:
        resumed = dataclasses.replace(checkpoint, resume=False, load=str(root))
        return dataclasses.replace(cfg, checkpoint=resumed), None
    fresh = dataclasses.replace(checkpoint, resume=False)
    return dataclasses.replace(cfg, checkpoint=fresh), _fresh_start_note(cfg, run_dir)


def apply_resume(cfg: RunConfig) -> None:
    """Resolve `checkpoint.resume` in `cfg` itself (the entry pipeline's object, so the path
    checks, the pre-flight and the ranks after this see the result); the fresh-start line is
    printed once, by the launching process or rank 0."""
    resolved, note = resolve_resume(cfg)
    cfg.checkpoint = resolved.checkpoint
    if note and os.environ.get("RANK", "0") == "0":
        print(f"resume: {note}", flush=True)


# The order a user meets them in: where the run writes, what it loads, what it reads.
RUN_PATH_RULES: tuple[PathRule, ...] = (
    *DIRECTORY_RULES, check_checkpoint_load_path, *INPUT_RULES,
)


def validate_paths(cfg: RunConfig, *, resume: bool = True) -> None:
    """Raise `ConfigError` with the first path problem (none for a dry run, which uses no files).
    First resolves `checkpoint.resume` in place (`apply_resume`) unless `resume=False` (a
    launcher on a login node: the job resolves it when it starts)."""
    if cfg.dry_run:
        return
    if resume:
        apply_resume(cfg)
    for rule in RUN_PATH_RULES:
        message = rule(cfg)
        if message:
            raise ConfigError(message)

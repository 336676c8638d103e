"""Checks the paths a configuration names, in the launching process, before any rank starts.

A checkpoint path that is wrong, or an output directory that cannot be written, otherwise shows
up minutes later as a traceback in every rank (after process groups, model build and Megatron's
own checks). These rules look at the filesystem, so they are kept apart from the pure rules of
`validation.py`; each still returns None or the one line naming the field, its value and the fix.
A dry run reads and writes no files, so it skips them (its checkpoint may live on the cluster).

A checkpoint's names on disk are in `checkpoint_format.py`: a crash leaves at most a `.tmp-`
directory (ignored here) or a `latest` naming a directory that is gone; the root then resumes
from its newest complete step (`newest_checkpoint`), and only a root with no complete step at
all is an error, raised here before any rank starts; the checkpoint's own `run.json` is checked
by `run_manifest.py`.

`checkpoint.resume=true` (what a requeued Slurm job runs with) is resolved here as well, first:
it becomes `checkpoint.load=<run_dir>/checkpoints` when that root holds a complete step, or a
fresh start, said in one line, when it does not (a first attempt, or one that stopped before its
first save). `validate_paths` is the first step of every entry point that reads the filesystem,
in the launching process and on each rank of an outside launch, so a resume then meets every
check and pre-flight a `checkpoint.load` meets, and the ranks and the run's `config.yaml` see a
plain `checkpoint.load`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.blend import empty_split_problem, load_blend
from recipes.config.checkpoint_format import (
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
from recipes.config.io import CONFIG_FILENAME
from recipes.config.phases import phase_config, phase_spans
from recipes.config.run_manifest import (
    damaged_file,
    incompatibility,
    read_manifest,
    reshard_problem,
    resume_notes,
)
from recipes.config.schema import RunConfig

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
    reason = reshard_problem(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} cannot resume in this layout: {reason}")
    return [] if cfg.checkpoint.load_model_only else resume_notes(cfg, step_dir, manifest)


def _missing_parts(path: Path) -> list[Path]:
    """The directories of `path` that do not exist yet, outermost first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing[::-1]


def try_create_directory(path: Path) -> OSError | None:
    """Create `path` and a file in it, then remove what was made: the only test that answers
    for root too (`os.access` says yes to root under /proc and on read-only mounts). Returns
    the error that stopped it, or None."""
    for attempt in range(5):
        missing = _missing_parts(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
            os.close(handle)
            os.unlink(probe)
        except FileNotFoundError as err:
            # Ranks check at once: another one may have removed the directory it made (and
            # this one found) between our mkdir and our probe. Try again; a path that really
            # cannot be made fails every time.
            if attempt == 4:
                return err
        except OSError as err:
            return err
        else:
            return None
        finally:
            for made in reversed(missing):  # leave the file system as it was
                with contextlib.suppress(OSError):
                    made.rmdir()
    return None


def _nearest_existing(path: Path) -> tuple[Path, bool]:
    """`path` or its nearest ancestor that exists, and whether it is a directory, from one
    `stat` each: ranks probe one directory at once, and a directory another rank removes
    between an `exists()` and an `is_dir()` would read as a file. One look sees it either as a
    directory or as absent, never as a file."""
    for candidate in (path, *path.parents):
        try:
            mode = candidate.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        return candidate, stat.S_ISDIR(mode)
    return Path(path.anchor), True


def directory_problem(key: str, value: str, fix: str) -> str | None:
    """`value` is a directory this process can write, or one it can create: tried for real,
    before any rank starts (and nothing is left behind). `fix` ends the message."""
    path = Path(value).absolute()
    existing, is_dir = _nearest_existing(path)
    if existing == path and not is_dir:
        return f"{key}={value} is a file, not a directory; {fix}"
    missing = existing != path
    if not is_dir:
        return f"{key}={value} cannot be created: {existing} is a file; {fix}"
    err = try_create_directory(path)
    if err is None:
        return None
    where = "it" if not missing else f"under {existing}"
    verb = "written" if not missing else "created"
    reason = err.strerror or type(err).__name__
    return f"{key}={value} cannot be {verb} ({where}: {reason}); {fix}"


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
    if os.environ.get("RANK", "0") == "0":
        for note in blend.notes:
            print(f"warning: {note}", file=sys.stderr, flush=True)
    weights = {source.weight for source in blend.train} - {0.0}
    if cfg.data.documents == "packed" and len(weights) > 1:
        return (f"data.blend={cfg.data.blend} weights its sources, but data.documents=packed "
                "trains on every pack of every source once; give the sources equal weights, or "
                "use data.documents=inter_document to keep the weights")
    if blend.vocab_size > cfg.model.vocab_size:
        return (f"data.blend={cfg.data.blend} holds token ids up to {blend.vocab_size - 1}, but "
                f"model.vocab_size={cfg.model.vocab_size}; set model.vocab_size={blend.vocab_size}")
    return None


def check_phase_blends(cfg: RunConfig) -> str | None:
    """Each phase's own blend passes the blend checks (exists, prepared, fits the model)."""
    if not cfg.phases:
        return None
    for span in phase_spans(cfg):
        if span.blend == cfg.data.blend:
            continue
        message = check_data_blend(phase_config(cfg, span))
        if message is not None:
            return f"phases[{span.index}] ({span.name}): {message}"
    return None


def check_blend_splits(cfg: RunConfig) -> str | None:
    """No blend source of the run or of a phase is too small for its train or held-out share
    (`blend.empty_split_problem`: Megatron's dataset builder would hang on it)."""
    if cfg.data.source != "blend" or cfg.data.documents == "packed":
        return None
    blends = [cfg.data.blend] + [span.blend for span in phase_spans(cfg)] if cfg.phases \
        else [cfg.data.blend]
    for path in dict.fromkeys(blend for blend in blends if blend is not None):
        try:
            message = empty_split_problem(load_blend(path))
        except ConfigError:
            continue  # the blend rules above say what is wrong with it
        if message is not None:
            return message
    return None


def check_cluster_spec(cfg: RunConfig) -> str | None:
    """`cluster.spec` names a readable cluster file (its peak TFLOP/s gives the MFU)."""
    spec = cfg.cluster.spec
    if spec is None or Path(spec).is_file():
        return None
    return (f"cluster.spec={spec} does not exist; name a cluster file, e.g. "
            "cluster.spec=conf/cluster/h100_80gb_8x8.yaml, or cluster.spec=null")


def check_real_data_beyond_one_node(cfg: RunConfig) -> str | None:
    """A run across nodes trains on prepared data: the built-in standard-library corpus (a few
    MB of Python source, the default so that CPU-sized recipes run anywhere) would burn the
    cluster's hours on a toy. Checked with the paths, before launch, on the nodes the launch
    uses (scripts/launch.py checks the config placed on its cluster file's nodes); planning and
    the dry run read no data. (`synthetic` is the machinery tests' corpus, named for what it
    is.)"""
    if cfg.cluster.nodes <= 1 or cfg.data.source != "python_stdlib":
        return None
    return (f"{cfg.name} runs on {cfg.cluster.nodes} nodes but data.source=python_stdlib is the "
            "built-in demo corpus; train on prepared data: data.source=blend "
            "data.blend=conf/data/<blend>.yaml (make its datasets with scripts/prepare_data.py "
            "input=<files> output=<prefix> tokenizer=<tokenizer.json>; docs/data.md), or try "
            "the launch machinery alone with data.source=synthetic")


PATH_RULES: tuple[PathRule, ...] = (
    check_output_dir, check_run_dir, check_checkpoint_load_path, check_data_blend,
    check_phase_blends, check_blend_splits, check_cluster_spec, check_real_data_beyond_one_node,
)


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


def validate_paths(cfg: RunConfig, *, resume: bool = True) -> None:
    """Raise `ConfigError` with the first path problem (none for a dry run, which uses no files).
    First resolves `checkpoint.resume` in place (`apply_resume`) unless `resume=False` (a
    launcher on a login node: the job resolves it when it starts)."""
    if cfg.dry_run:
        return
    if resume:
        apply_resume(cfg)
    for rule in PATH_RULES:
        message = rule(cfg)
        if message:
            raise ConfigError(message)

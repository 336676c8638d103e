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

from data_prep.blend_prepare import check_prepare_entries
from plugins.protocol.errors import ConfigError, config_error
from recipes.config.io import CONFIG_FILENAME
from recipes.config.links import resolved
from recipes.config.path_rules import (
    DIRECTORY_RULES,
    INPUT_RULES,
    PathRule,
    check_run_dir,
)
from recipes.config.schema import RunConfig
from recipes.config.validation import each_problem
from trainer.checkpoint.format import (
    CHECKPOINT_MARKER,
    DCP_METADATA,
    HF_IMPORT_SOURCE,
    IMPORT_CONFIG,
    ITER_PREFIX,
    LATEST_FILE,
    LEGACY_PREFIX,
    MEGATRON_LM_TRACKER,
    RELEASE_DIR,
    RUN_CHECKPOINTS,
    TMP_INFIX,
    complete_steps,
    damaged_newest,
    fallback_note,
    is_checkpoint,
    is_hf_import,
    is_project_step,
    is_release,
    latest_name,
    newest_checkpoint,
    step_damage,
    step_of,
    tracker_file,
    unfinished_saves,
    unreadable_file,
    unreadable_text,
)
from trainer.checkpoint.manifest import (
    damaged_file,
    finished_note,
    format_problem,
    incompatibility,
    iterations_problem,
    manifest_problem,
    optimizer_kind_problem,
    precision_problem,
    read_manifest,
    reshard_problem,
    resume_notes,
    tokenizer_refusal,
)
from trainer.checkpoint.megatron_lm import (
    foreign_manifest,
    foreign_notes,
    foreign_resume_problem,
    unchecked_damage,
)

CHECKPOINT_EXAMPLE = "runs/<run>/checkpoints"


def _no_complete_step_message(load: str, root: Path) -> str:
    """A checkpoint root (a `latest` or Megatron-LM tracker file, or step directories) with no
    step to resume from."""
    fix = "point checkpoint.load at another checkpoint or set checkpoint.load=null"
    name, tracker = latest_name(root), tracker_file(root)
    if (root / tracker).exists() and not name:
        what = "names no step ('')" if name == "" else "cannot be read"
        return f"checkpoint.load={load}: its {tracker} file {what}; {fix}"
    if name and not (root / name).is_dir():
        return (f"checkpoint.load={load}: {tracker} names {name}, but {root / name} does not "
                f"exist and no other step is complete; {fix}")
    if name:
        return (f"checkpoint.load={load}: {tracker} names {name}, but {root / name} has no "
                f"{CHECKPOINT_MARKER} (an unfinished save?) and no other step is complete; {fix}")
    unfinished = [p.name for p in unfinished_saves(root)]
    return (f"checkpoint.load={load} holds no complete checkpoint, only unfinished saves "
            f"({', '.join(unfinished)}); {fix}")


def _entries(path: Path) -> list[Path]:
    """What a directory holds ([] where it cannot be listed)."""
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _other_format_message(load: str, path: Path) -> str | None:
    """A Megatron-LM checkpoint in a format other than torch_dist: which, and how to convert
    (looked for in `path` and in its steps under Megatron-LM's names)."""
    steps = [path, *(p for p in _entries(path) if p.is_dir() and TMP_INFIX not in p.name
                     and (p.name.startswith(ITER_PREFIX) or p.name == RELEASE_DIR))]
    if any(p.name.startswith(LEGACY_PREFIX) for step in steps for p in _entries(step)
           if p.is_dir()):
        return (f"checkpoint.load={load} is a Megatron-LM checkpoint in the older torch format "
                f"({LEGACY_PREFIX}* files); this project loads torch_dist: convert it with "
                "Megatron-LM's --ckpt-convert-format torch_dist --ckpt-convert-save <dir>")
    if any((step / DCP_METADATA).is_file() for step in steps):
        return (f"checkpoint.load={load} is a torch DCP checkpoint without Megatron's "
                f"{CHECKPOINT_MARKER} (Megatron-LM's torch_dcp or fsdp_dtensor format); this "
                "project loads torch_dist: save it with --ckpt-format torch_dist")
    return None


def _not_a_checkpoint_message(load: str, path: Path) -> str:
    """A directory that is neither a checkpoint nor a checkpoint root: say where one might be."""
    if (path / RUN_CHECKPOINTS).is_dir():
        return (
            f"checkpoint.load={load} is a run directory, not a checkpoint; set "
            f"checkpoint.load={path / RUN_CHECKPOINTS}"
        )
    return (
        f"checkpoint.load={load} is not a Megatron checkpoint (no {CHECKPOINT_MARKER}, no "
        f"{LATEST_FILE} file and no {MEGATRON_LM_TRACKER}); point it at a saved checkpoint, "
        f"e.g. checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
    )


def damaged_step_problem(load: str, path: Path) -> str | None:
    """A published step that is damaged where a resume would otherwise pass over it
    (`format.step_damage`: not readable, or its `metadata.json` lost): `path` itself, or the
    step a root would resume from were it whole (`format.damaged_newest`). The damage line
    names it and the previous complete step; None otherwise."""
    damage = step_damage(path)
    if damage:
        return _damage_message(load, path, damage)
    if is_checkpoint(path):
        return None
    damaged = damaged_newest(path)
    return None if damaged is None else _damage_message(load, damaged, step_damage(damaged))


def unfinished_save_problem(load: str, path: Path) -> str | None:
    """A `.tmp-` directory (or a file in one) named directly: a save in progress or one a crash
    left, never a checkpoint, though it may hold every file of one. Refused, naming its root and
    the root's newest complete step."""
    tmp = next((p for p in (path, path.parent) if TMP_INFIX in p.name), None)
    if tmp is None:
        return None
    root = tmp.parent
    newest = newest_checkpoint(root)
    fix = (f"set checkpoint.load={root} (its newest complete step is {newest.name})"
           if newest is not None else
           f"{root} holds no complete step; start without checkpoint.load")
    return (f"checkpoint.load={load} is an unfinished save ({tmp.name}: a save still in "
            f"progress or one a crash left, '{TMP_INFIX}' in its name), not a checkpoint; {fix}")


def _step_holding(path: Path) -> Path | None:
    """The checkpoint directory a file belongs to: a step's (or an import's) own file, or a
    root's `latest` or tracker file; None for any other file."""
    parent = path.parent
    if path.name in (CHECKPOINT_MARKER, LATEST_FILE, MEGATRON_LM_TRACKER):
        return parent
    if step_of(parent.name) is not None or is_checkpoint(parent) or is_hf_import(parent):
        return parent
    if parent.name == HF_IMPORT_SOURCE and is_hf_import(parent.parent):
        return parent.parent
    return None


def file_load_problem(load: str, path: Path) -> str | None:
    """`checkpoint.load` names a file: the step directory (or root) it belongs to, else the
    usual root, is what to set."""
    if path.is_dir():
        return None
    holder = _step_holding(path)
    fix = f"checkpoint.load={holder}" if holder else f"checkpoint.load={CHECKPOINT_EXAMPLE}"
    return f"checkpoint.load={load} is a file, not a checkpoint directory; set {fix}"


def _directory_problem(load: str, path: Path) -> str | None:
    """A `checkpoint.load` directory: one checkpoint, or a root with a complete step (a
    damaged one is `damaged_step_problem`'s, checked first)."""
    if is_checkpoint(path) or newest_checkpoint(path) is not None:
        return None
    other = _other_format_message(load, path)  # Megatron-LM's tracker is there in any format
    if other:
        return other
    if ((path / LATEST_FILE).exists() or (path / MEGATRON_LM_TRACKER).exists()
            or unfinished_saves(path)):
        return _no_complete_step_message(load, path)
    return _not_a_checkpoint_message(load, path)


def check_run_dir_not_reused(cfg: RunConfig) -> str | None:
    """A start from step 0 (neither `checkpoint.load` nor `checkpoint.resume`) in a `run_dir`
    whose checkpoints hold a complete step: it would write its log over that run's and publish
    its own steps beside them, `latest` moving back to its first. Refused with the two ways
    out (Megatron-LM, given that directory as --load, would continue it)."""
    checkpoint = cfg.checkpoint
    if not cfg.run_dir or not cfg.run_dir.strip() or checkpoint.resume or checkpoint.load:
        return None
    root = resolved(cfg.run_dir) / RUN_CHECKPOINTS
    newest = newest_checkpoint(root) if root.is_dir() else None
    if newest is None:
        return None
    return (f"run_dir={cfg.run_dir} holds the checkpoints of a run (newest {newest.name}) and "
            "this run would start over from step 0 there; continue that run with "
            "checkpoint.resume=true, or give this one another run_dir= (or move "
            f"{root} aside)")


def check_checkpoint_load_path(cfg: RunConfig) -> str | None:
    """`checkpoint.load` is a finished checkpoint or a checkpoint root with a complete step."""
    load = cfg.checkpoint.load
    if load is None or not load.strip():
        return None  # empty text is `check_empty_strings`'s message
    path = Path(load)
    tilde = " (~ is not expanded; write the full path)" if load.startswith("~") else ""
    try:
        exists = path.exists()
    except OSError as err:  # in a directory this user may not enter: a step's, or any
        return damaged_step_problem(load, path.parent) or (
            f"checkpoint.load={load} cannot be read ({err.strerror}); fix its permissions or "
            "point checkpoint.load elsewhere")
    if not exists:
        return (
            f"checkpoint.load={load} does not exist{tilde}; point it at a saved checkpoint, "
            f"e.g. checkpoint.load={CHECKPOINT_EXAMPLE}, or set checkpoint.load=null"
        )
    problem = (unfinished_save_problem(load, path) or file_load_problem(load, path)
               or damaged_step_problem(load, path))  # before listing it: it may be unreadable
    if problem:
        return problem
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
    manifest = read_manifest(step_dir) or foreign_manifest(step_dir)
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
    if is_hf_import(step_dir):
        fallback = "import the Hugging Face model again (scripts/convert.py import)"
    elif previous is None:
        fallback = "no earlier complete checkpoint exists; start without checkpoint.load"
    else:
        fallback = (f"fall back to the previous complete checkpoint with checkpoint.load="
                    f"{previous} (or delete {step_dir}: the root then resumes from it)")
    return f"checkpoint.load={load}: {damage}; {fallback}"


def checkpoint_preflight(cfg: RunConfig) -> list[str]:
    """The checkpoint a run loads, checked against its `run.json` before any rank starts:
    a damaged file or a model that cannot load it raises `ConfigError` (one line); returns the
    lines that say what a full resume continues from and what it changes, first the one that
    says a root's `latest` or tracker file named no complete step (`format.fallback_note`)."""
    load = cfg.checkpoint.load
    if cfg.dry_run or load is None or check_checkpoint_load_path(cfg) is not None:
        return []
    step_dir = loaded_step(load)
    if step_dir is None:
        return []
    fallback = None if is_checkpoint(Path(load)) else fallback_note(Path(load))
    return [*([fallback] if fallback else []), *_step_preflight(cfg, load, step_dir)]


def _step_preflight(cfg: RunConfig, load: str, step_dir: Path) -> list[str]:
    """`checkpoint_preflight` of the step `load` resolved to."""
    if is_release(step_dir) and not cfg.checkpoint.load_model_only:
        raise ConfigError(f"checkpoint.load={load} resumes from Megatron-LM's release "
                          "checkpoint, which holds weights only (no step, optimizer or "
                          "schedule); start from its weights with checkpoint.load_model_only=true")
    broken = manifest_problem(step_dir) if is_project_step(step_dir) else None
    if broken:  # without it none of the checks below could run
        raise ConfigError(_damage_message(load, step_dir, broken))
    manifest = read_manifest(step_dir)
    unreadable = unreadable_file(step_dir) if manifest is None else None
    if unreadable:  # a step without run.json: its files are not listed for `damaged_file`
        raise ConfigError(_damage_message(load, step_dir, unreadable_text(
            unreadable, f"{step_dir.name}/{unreadable.name}")))
    if manifest is None and is_hf_import(step_dir):
        return import_preflight(cfg, load, step_dir)
    if manifest is None:
        damage = unchecked_damage(step_dir)
        if damage:
            raise ConfigError(_damage_message(load, step_dir, damage))
        foreign = foreign_manifest(step_dir)
        return [] if foreign is None else foreign_preflight(cfg, load, step_dir, foreign)
    damage = damaged_file(step_dir, manifest, cfg.checkpoint.verify == "checksum")
    if damage:
        raise ConfigError(_damage_message(load, step_dir, damage))
    reason = incompatibility(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} does not fit this run's model: {reason}; "
                          "use the saved value, or start from another checkpoint")
    reason = tokenizer_refusal(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} was trained on another tokenizer's ids: "
                          f"{reason}")
    if is_hf_import(step_dir) and not cfg.checkpoint.load_model_only:
        raise ConfigError(_weights_only_import_message(load))
    reason = (format_problem(cfg, manifest) or optimizer_kind_problem(cfg, manifest)
              or precision_problem(cfg, manifest))
    if reason:
        raise ConfigError(f"checkpoint.load={load} cannot be loaded by this run: {reason}")
    reason = reshard_problem(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} cannot resume in this layout: {reason}")
    reason = iterations_problem(cfg, manifest["step"])
    if reason:
        raise ConfigError(f"checkpoint.load={load}: {reason}")
    finished = finished_note(cfg, manifest["step"])
    return [] if cfg.checkpoint.load_model_only else [
        *resume_notes(cfg, step_dir, manifest), *([finished] if finished else [])]


def foreign_preflight(cfg: RunConfig, load: str, step_dir: Path,
                      manifest: dict) -> list[str]:
    """A step Megatron-LM or Megatron Bridge wrote, checked as one of ours is against what it
    says about itself (`megatron_lm.foreign_manifest`): a model of another shape or padding is
    refused; what a full resume continues from and changes is returned, one line each."""
    writer = manifest["writer"]
    reason = incompatibility(cfg, manifest)
    if reason:
        raise ConfigError(f"checkpoint.load={load} ({writer}'s) does not fit this run's model: "
                          f"{reason}; use the saved value, or start from another checkpoint")
    if cfg.checkpoint.load_model_only:
        return []
    reason = (reshard_problem(cfg, manifest) or optimizer_kind_problem(cfg, manifest)
              or precision_problem(cfg, manifest) or foreign_resume_problem(cfg, manifest))
    if reason:
        raise ConfigError(f"checkpoint.load={load} ({writer}'s) cannot resume in this run: "
                          f"{reason}")
    reason = iterations_problem(cfg, manifest["step"])
    if reason:
        raise ConfigError(f"checkpoint.load={load} ({writer}'s): {reason}")
    finished = finished_note(cfg, manifest["step"])
    return [*foreign_notes(cfg, step_dir, manifest), *([finished] if finished else [])]


def _weights_only_import_message(load: str) -> str:
    """A full resume of a Hugging Face import: it has no step, optimizer or schedule, and
    Megatron's load of them fails in every rank with a `KeyError`."""
    return (f"checkpoint.load={load} is a Hugging Face import (scripts/convert.py import), which "
            "holds weights only (no step, optimizer or schedule); add "
            "checkpoint.load_model_only=true")


def import_preflight(cfg: RunConfig, load: str, step_dir: Path) -> list[str]:
    """A Hugging Face import without a `run.json` (one written before imports had one) still
    holds the recipe it was converted for: a model of another shape or padding is refused as a
    run's checkpoint is (Megatron would fail in every rank with a `KeyError` or a shape
    error), and so is a full resume (`_weights_only_import_message`). Returns no lines."""
    from recipes.config.io import config_dict, load_config

    try:
        saved = load_config(step_dir / IMPORT_CONFIG)
    except ConfigError as err:
        raise ConfigError(f"checkpoint.load={load} is a Hugging Face import whose "
                          f"{IMPORT_CONFIG} cannot be read ({err}); import it again with "
                          "scripts/convert.py import") from None
    reason = incompatibility(cfg, {"config": config_dict(saved),
                                   "padded_vocab_size": saved.layout.padded_vocab})
    if reason:
        raise ConfigError(f"checkpoint.load={load} (a Hugging Face import for recipe "
                          f"{saved.name}) does not fit this run's model: {reason}; train it "
                          f"with recipe={saved.name} or a recipe of its shape")
    if not cfg.checkpoint.load_model_only:
        raise ConfigError(_weights_only_import_message(load))
    return []



def _fresh_start_note(cfg: RunConfig, run_dir: Path) -> str:
    if (run_dir / CONFIG_FILENAME).is_file():
        return (f"run_dir={cfg.run_dir} has a {CONFIG_FILENAME} but no complete checkpoint in "
                f"{run_dir / RUN_CHECKPOINTS} (the last start stopped before its first save); "
                "starting again from step 0")
    return f"run_dir={cfg.run_dir} holds no checkpoint yet; starting from step 0"


def _is_checkpoint_root(path: Path) -> bool:
    """A folder of checkpoints: a `latest` or Megatron-LM tracker file, a complete step or an
    unfinished save."""
    return ((path / LATEST_FILE).exists() or (path / MEGATRON_LM_TRACKER).exists()
            or newest_checkpoint(path) is not None or bool(unfinished_saves(path)))


def run_dir_in_checkpoints(cfg: RunConfig) -> str | None:
    """`checkpoint.resume=true` continues `<run_dir>/checkpoints`; a `run_dir` that is itself a
    checkpoints folder or one of its steps (the path of a save, given by mistake) holds no
    `checkpoints/`, so the resume would start a new run from step 0 inside it. Refused, with
    the run directory it belongs to."""
    if not cfg.checkpoint.resume or not cfg.run_dir:
        return None
    path = Path(cfg.run_dir)
    if not path.is_dir() or (path / RUN_CHECKPOINTS).is_dir():
        return None
    in_root = _is_checkpoint_root(path.parent)
    if is_checkpoint(path) or (step_of(path.name) is not None and in_root):
        what, root = "a checkpoint step", path.parent if in_root else path
    elif _is_checkpoint_root(path):
        what, root = "a checkpoints folder", path
    else:
        return None
    fix = (f"set run_dir={root.parent}" if root.name == RUN_CHECKPOINTS else
           f"continue from it with checkpoint.load={root} and a run_dir of its own")
    return (f"run_dir={cfg.run_dir} is {what}, not a run directory: checkpoint.resume=true "
            f"would start a new run inside it; {fix}")


def resolve_resume(cfg: RunConfig) -> tuple[RunConfig, str | None]:
    """`checkpoint.resume=true` as what it means for this start: `checkpoint.load=<run_dir>/
    checkpoints` when that root holds a complete step (Megatron-LM's `--load` = `--save`), else
    a fresh start and the line that says so. The result has `resume` off, so it is a plain
    config to every later check, to the ranks and in the run's config.yaml. Returned unchanged
    when resume is off or a rule about it is broken (that rule's message comes first); a
    `run_dir` that is a checkpoints folder or step raises `ConfigError`."""
    checkpoint = cfg.checkpoint
    if not checkpoint.resume or checkpoint.load is not None or not cfg.run_dir:
        return cfg, None
    if check_run_dir(cfg) is not None:
        return cfg, None
    inside = run_dir_in_checkpoints(cfg)
    if inside:
        raise ConfigError(inside)
    run_dir = resolved(cfg.run_dir)
    root = run_dir / RUN_CHECKPOINTS
    if root.is_dir() and (newest_checkpoint(root) is not None
                          or damaged_newest(root) is not None):  # damage: refused as a load
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


# The order a user meets them in: where the run writes, what it loads, what it reads, and
# what a blend's prepare: list would make (its entries' keys by prepare_data's own parser).
RUN_PATH_RULES: tuple[PathRule, ...] = (
    *DIRECTORY_RULES, check_run_dir_not_reused, check_checkpoint_load_path, *INPUT_RULES,
    check_prepare_entries,
)


def path_problems(cfg: RunConfig, rules: tuple[PathRule, ...] = RUN_PATH_RULES) -> list[str]:
    """The message of every path rule `cfg` breaks, in the order a user meets them. A rule that
    cannot judge a config another rule (or a value rule) refused, and raises, is passed over
    once a problem is known (`each_problem`)."""
    return each_problem(cfg, rules)


def validate_paths(cfg: RunConfig, *, resume: bool = True) -> None:
    """Raise `ConfigError` with every path problem, one line each (`ConfigErrors` for several;
    none for a dry run, which uses no files). First resolves `checkpoint.resume` in place
    (`apply_resume`) unless `resume=False` (a launcher on a login node: the job resolves it
    when it starts)."""
    if cfg.dry_run:
        return
    if resume:
        apply_resume(cfg)
    error = config_error(path_problems(cfg))
    if error is not None:
        raise error

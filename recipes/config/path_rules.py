"""Checks the paths a configuration names, in the launching process, before any rank starts.

An output directory that cannot be written, or a blend file that is missing, otherwise shows up
minutes later as a traceback in every rank (after process groups, model build and Megatron's
own checks). These rules look at the filesystem, so they are kept apart from the pure rules of
`validation.py`; each still returns None or the one line naming the field, its value and the fix.
A dry run reads and writes no files, so it skips them (its checkpoint may live on the cluster).

The checkpoint a run loads is the trainer's: its rule, `checkpoint.resume` and the checkpoint
pre-flight are in `trainer/checkpoint/preflight.py`, whose `validate_paths` runs these rules
with the checkpoint rule between `DIRECTORY_RULES` and `INPUT_RULES`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.blend import Blend, empty_split_problem, load_blend
from recipes.config.phases import phase_config, phase_spans
from recipes.config.schema import RunConfig
from recipes.config.yaml_file import not_a_file


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
        except FileExistsError as err:
            # Or between `mkdir`'s "exists" and its own look that it is a directory
            # (`Path.mkdir(exist_ok=True)` then raises "File exists"). A file there is real.
            if attempt == 4 or path.is_file():
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


def _unwritable(path: Path) -> str | None:
    """Why the directory `path` can be neither written nor created, as the end of a line
    ("is a file, not a directory", "cannot be created: /x is a file", ...); None when it can:
    tried for real, and nothing is left behind."""
    try:
        existing, is_dir = _nearest_existing(path)
    except OSError as err:  # a symbolic link that loops, a folder this user may not search
        return f"cannot be used ({err.strerror or type(err).__name__}: {err.filename})"
    if existing == path and not is_dir:
        return "is a file, not a directory"
    missing = existing != path
    if not is_dir:
        return f"cannot be created: {existing} is a file"
    err = try_create_directory(path)
    if err is None:
        return None
    where = "it" if not missing else f"under {existing}"
    verb = "written" if not missing else "created"
    reason = err.strerror or type(err).__name__
    return f"cannot be {verb} ({where}: {reason})"


def directory_problem(key: str, value: str, fix: str) -> str | None:
    """`value` is a directory this process can write, or one it can create: tried for real,
    before any rank starts (and nothing is left behind). `fix` ends the message."""
    reason = _unwritable(Path(value).absolute())
    return None if reason is None else f"{key}={value} {reason}; {fix}"


def output_file_problem(key: str, value: str, fix: str) -> str | None:
    """`value` is a file this process can write: not a directory, an existing file open for
    writing, and its folder one it can write or create (`_unwritable`, tried for real and left
    as it was). Checked before the work that ends in writing it. `fix` ends the message."""
    path = Path(value).absolute()
    if path.is_dir():
        return f"{key}={value} is a directory, not a file; {fix}"
    reason = _unwritable(path.parent)
    if reason is not None:
        return f"{key}={value} cannot be written: its folder {path.parent} {reason}; {fix}"
    if path.is_file():  # a regular one only: opening a FIFO would wait for its reader
        try:
            with path.open("ab"):  # appends nothing: the file is left as it was
                pass
        except OSError as err:
            return (f"{key}={value} cannot be written ({err.strerror or type(err).__name__}); "
                    f"{fix}")
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


# A model vocabulary at least this many times the blend tokenizer's is warned about: most of
# its embedding and output rows would never see a token.
VOCAB_SLACK = 2


def _tokenizer_words(blend: Blend) -> str:
    return f"tokenizer {blend.tokenizer}" if blend.tokenizer else "tokenizer"


def vocabulary_too_small(cfg: RunConfig, blend: Blend) -> str | None:
    """The model has a row for every id the blend's tokenizer gives (refused otherwise: an id
    past the embedding is an index error on every rank, minutes in)."""
    if blend.vocab_size <= cfg.model.vocab_size:
        return None
    return (f"data.blend={cfg.data.blend} holds token ids up to {blend.vocab_size - 1}, but "
            f"model.vocab_size={cfg.model.vocab_size}; set model.vocab_size={blend.vocab_size}"
            f" (its {_tokenizer_words(blend)} has {blend.vocab_size} ids), or prepare the data "
            f"with a tokenizer of at most {cfg.model.vocab_size} ids")


def vocabulary_much_larger(cfg: RunConfig, blend: Blend) -> str | None:
    """The warning for a model vocabulary `VOCAB_SLACK` or more times the blend tokenizer's
    (a recipe's 128,256-token vocabulary fed a 2,048-token BPE), else None."""
    if cfg.model.vocab_size < VOCAB_SLACK * blend.vocab_size:
        return None
    model, ids = cfg.model.vocab_size, blend.vocab_size
    return (f"model.vocab_size={model} is {model / ids:.1f}x the {ids} ids of data.blend="
            f"{cfg.data.blend}'s "
            f"{_tokenizer_words(blend)}: {model - ids} embedding and output rows never see a "
            "token and the output layer computes them every step; set model.vocab_size="
            f"{ids} (Megatron pads it for TP), or prepare the data with the "
            "model's own tokenizer")


def check_data_blend(cfg: RunConfig) -> str | None:
    """The blend file, its prefixes and manifests exist and share one tokenizer; its
    vocabulary fits the model (a much larger model vocabulary is warned about)."""
    if cfg.data.source != "blend" or cfg.data.blend is None:
        return None
    try:
        blend = load_blend(cfg.data.blend)
    except ConfigError as error:
        return str(error)
    if os.environ.get("RANK", "0") == "0":
        larger = vocabulary_much_larger(cfg, blend)
        for note in (*blend.notes, *([larger] if larger else [])):
            print(f"warning: {note}", file=sys.stderr, flush=True)
    return vocabulary_too_small(cfg, blend) or blend_sources_problem(cfg, blend)


# Megatron's BlendedDataset numbers a blend's sources in int16 and asserts fewer than 32,767
# (`datasets/blended_dataset.py`); packed rows take their order from the same index
# (`trainer/pack_order.py`).
MOST_BLEND_SOURCES = 32_766


def blend_sources_problem(cfg: RunConfig, blend: Blend) -> str | None:
    """A blend with more sources than Megatron's blending index can number."""
    count = max(len(blend.train), len(blend.valid or ()))
    if count <= MOST_BLEND_SOURCES:
        return None
    return (f"data.blend={cfg.data.blend} has {count:,} sources, more than the "
            f"{MOST_BLEND_SOURCES:,} Megatron's blending index numbers (int16); list each "
            "preparation's shards as one manifest entry (a manifest is one source)")


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
    return (f"cluster.spec={spec} {not_a_file(spec)}; name a cluster file, e.g. "
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


# Where the run writes (checked first), then what it reads; the trainer's `validate_paths` runs
# the checkpoint rule between the two.
DIRECTORY_RULES: tuple[PathRule, ...] = (check_output_dir, check_run_dir)
INPUT_RULES: tuple[PathRule, ...] = (
    check_data_blend, check_phase_blends, check_blend_splits, check_cluster_spec,
    check_real_data_beyond_one_node,
)
PATH_RULES: tuple[PathRule, ...] = (*DIRECTORY_RULES, *INPUT_RULES)

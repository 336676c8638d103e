"""Atomic publication of a save: `run.json`, the rename into place, `latest`, rotation.

A crash never leaves a half-written checkpoint under a final name: a save is written to
`step_NNNNNNN.tmp-<token>` (one token for all ranks, `PendingSave`), and once every rank's files
are complete rank 0 writes `run.json` (counters, layout, versions, tokenizer, resolved config,
size and CRC-32 of every file, each rank checksumming its own; `manifest.py` reads it before a
later start), renames the directory to `step_NNNNNNN` and only then replaces `latest` (written
aside, renamed over). A crash at any point leaves the previous checkpoint or the new one as the
newest complete step, which is what a resume picks (`format.newest_checkpoint`).
`checkpoint.keep_last` rotation runs after publication and never deletes the step this run
resumed from, nor a save an asynchronous writer is still writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import uuid
from pathlib import Path

import torch

from recipes.config.io import config_dict
from trainer.checkpoint import disk_errors
from trainer.checkpoint.format import (
    ITER_PREFIX,
    LATEST_FILE,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    MEGATRON_LM_TRACKER,
    TMP_INFIX,
    complete_steps,
    step_name,
    step_of,
    step_of_unfinished,
    unfinished_saves,
)
from trainer.checkpoint.manifest import file_record, layout_record, tokenizer_identity
from trainer.state import RunState


def _shared_token(step: int) -> str:
    """A name part unique to this save and identical on every rank (rank 0 draws it)."""
    token = [f"{step}-{uuid.uuid4().hex[:8]}" if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)
    return token[0]



class PendingSave:
    """One save: where it is written (`.tmp-<token>`, one token for all ranks) and published
    (`layout`: `checkpoint.format`, whose step names it takes)."""

    def __init__(self, root: Path, state: RunState, layout: str = ""):
        self.root, self.state = root, state
        self.final = root / step_name(state.step, layout)
        self.tmp = root / f"{self.final.name}{TMP_INFIX}{_shared_token(state.step)}"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"torch": torch.__version__, "python": platform.python_version()}
    for package in ("megatron-core", "mcore-recipes"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


def _own_files(tmp: Path, rank: int) -> list[Path]:
    """The files this rank wrote: Megatron's writer names rank r's shards `__r_<n>.distcp`
    (dist_checkpointing/strategies/filesystem_async.py:495); rank 0 also writes the shared ones
    (`.metadata`, `metadata.json`, `common.pt`)."""
    files = [p for p in tmp.iterdir() if p.is_file()]
    own = [p for p in files if p.name.startswith(f"__{rank}_")]
    if rank == 0:
        own += [p for p in files if not re.match(r"__\d+_", p.name)]
    return own


def _manifest(session, state: RunState, files: dict[str, dict]) -> dict:
    cfg = session.cfg
    return {
        "format": MANIFEST_FORMAT, "step": state.step, "consumed_samples": state.consumed_samples,
        "consumed_tokens": state.consumed_tokens, "world_size": state.world_size,
        "layout": layout_record(cfg.layout), "padded_vocab_size": cfg.layout.padded_vocab,
        "versions": versions(), "tokenizer": tokenizer_identity(cfg),
        "config": config_dict(cfg), "files": dict(sorted(files.items())),
    }


def _write_manifest(session, state: RunState, tmp: Path) -> None:
    """Every rank checksums the files it wrote; rank 0 writes `run.json` with all of them
    (`manifest.py` reads it before a later launch)."""
    rank = torch.distributed.get_rank()
    records = {p.name: file_record(p) for p in _own_files(tmp, rank)}
    gathered = [None] * torch.distributed.get_world_size() if rank == 0 else None
    torch.distributed.gather_object(records, gathered, dst=0)
    if rank != 0:
        return
    files = {name: record for part in gathered for name, record in part.items()}
    with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as f:
        json.dump(_manifest(session, state, files), f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (cheap; skipped where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _rename_into_place(tmp: Path, final: Path) -> None:
    """Rank 0, once every rank finished: the save becomes a complete step by one rename."""
    if final.exists():  # a re-save of a step (a resume from an earlier one): replace it
        replaced = final.parent / f"{final.name}{TMP_INFIX}replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
        tmp.rename(final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        tmp.rename(final)


def _replace_file(path: Path, text: str) -> None:
    """`path` holds `text`, written aside and renamed over (never half written)."""
    aside = path.parent / f"{path.name}{TMP_INFIX}{os.getpid()}"
    with open(aside, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    aside.replace(path)


def _point_latest(final: Path) -> None:
    """Rank 0, last: `latest` names the new step (written aside, then renamed over); a step in
    Megatron-LM's layout is also named by its tracker, as Megatron-LM writes it (the iteration,
    `training/checkpointing.py:1005-1012`), so its `--load` finds the step."""
    root = final.parent
    _replace_file(root / LATEST_FILE, final.name)
    if final.name.startswith(ITER_PREFIX):
        _replace_file(root / MEGATRON_LM_TRACKER, str(step_of(final.name)))
    _fsync_dir(root)


def checkpoints_to_delete(
    existing_steps: list[int], keep_last: int | None, resumed_from: int | None
) -> list[int]:
    """The complete steps `checkpoint.keep_last` rotation deletes: all but the newest
    `keep_last`, never `resumed_from` (the step this run loaded); none when `keep_last` is None."""
    if keep_last is None:
        return []
    older = sorted(existing_steps)[:-keep_last]
    return [step for step in older if step != resumed_from]


def _stale_saves(root: Path, newest: int, writing: tuple[Path, ...] = ()) -> list[Path]:
    """`.tmp-` directories of saves at or before the newest published step (crash leftovers),
    except those still being written (`writing`: an asynchronous save in flight)."""
    stale = []
    busy = {path.name for path in writing}
    for path in unfinished_saves(root):
        step = step_of_unfinished(path)
        if step is not None and step <= newest and path.name not in busy:
            stale.append(path)
    return stale


def _rotate(root: Path, keep_last: int | None, resumed_from: Path | None,
            writing: tuple[Path, ...] = ()) -> None:
    """Rank 0, after publication: drop rotated-out steps and leftovers of crashed saves
    (never a save in `writing`, whose writer is still at work)."""
    steps = {step_of(p.name): p for p in complete_steps(root)}
    protected = None
    if resumed_from is not None and resumed_from.parent.resolve() == root.resolve():
        protected = step_of(resumed_from.name)
    for step in checkpoints_to_delete(list(steps), keep_last, protected):
        shutil.rmtree(steps[step], ignore_errors=True)
    for path in _stale_saves(root, max(steps, default=-1), writing):
        shutil.rmtree(path, ignore_errors=True)


def publish(session, save: PendingSave, writing: tuple[Path, ...] = ()) -> None:
    """Every rank's files are complete: checksums into `run.json`, then rank 0 renames the
    step into place, points `latest` at it and rotates (never a save in `writing`)."""
    disk_errors.run_phases(save, (lambda: _write_manifest(session, save.state, save.tmp),))
    if torch.distributed.get_rank() == 0:
        put_in_place(save.tmp, save.final, session.cfg.checkpoint.keep_last,
                     session.resumed_from, writing)
    torch.distributed.barrier()


def put_in_place(tmp: Path, final: Path, keep_last: int | None, resumed_from: Path | None,
                 writing: tuple[Path, ...] = ()) -> None:
    """Rank 0's part of `publish`, in this order: the complete save `tmp` renamed to `final`,
    `latest` pointed at it, then rotation (a crash between two leaves a root that resumes from
    a complete step)."""
    _rename_into_place(tmp, final)
    _point_latest(final)
    _rotate(final.parent, keep_last, resumed_from, writing)

"""A save the file system refuses (full, over quota, read-only), agreed across ranks.

A save runs in phases (make the `.tmp-` directory, write the shards, write `run.json`); after
each one every rank's outcome is shared, which is also the phase's barrier. A refusal on any
rank then removes the unfinished save and stops every rank with the same one-line
`CheckpointWriteError`, naming what is left to resume from, before the previous step or
`latest` was touched. Any other error is raised as it is. Megatron's writer loses the errno of
a failed write, so the disk itself is asked what went wrong
(`megatron_fixes.disk_refusal`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from plugins.protocol.errors import UserError
from trainer.checkpoint import megatron_fixes
from trainer.checkpoint.format import LATEST_FILE, newest_checkpoint
from trainer.checkpoint.megatron_fixes import DISK_ERRNOS


class CheckpointWriteError(UserError):
    """A save the file system refused (full, over quota, read-only): every rank stops with it."""


def disk_error(error: BaseException) -> OSError | None:
    """The file system's refusal inside `error`: itself, its causes, or the per-rank failures
    torch DCP wraps in a `CheckpointException` (torch/distributed/checkpoint/api.py)."""
    seen, todo = set(), [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return current
        failures = getattr(current, "failures", None)  # rank -> (exception, traceback)
        wrapped = list(failures.values()) if isinstance(failures, dict) else []
        todo += [current.__cause__, current.__context__,
                 *[item[0] if isinstance(item, tuple) else item for item in wrapped]]
        todo = [item for item in todo if isinstance(item, BaseException)]
    return None


def attempt(step: Callable[[], None], directory: Path) -> str | None:
    """Run one phase of a save; the file system's refusal as words, other errors raised."""
    try:
        step()
    except CheckpointWriteError:  # a publication that already stopped every rank
        raise
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        disk = disk_error(error) or megatron_fixes.disk_refusal(
            directory if directory.is_dir() else directory.parent)
        if disk is None:
            raise
        return f"{disk.strerror or os.strerror(disk.errno)}"
    return None


def agree(reason: str | None) -> str | None:
    """Every rank's outcome of a save phase, shared (it is also the phase's barrier): the first
    refusal any rank met, or None."""
    gathered: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, reason)
    return next((item for item in gathered if item), None)


def abandon(tmp: Path, root: Path, step: int, reason: str) -> CheckpointWriteError:
    """Remove the unfinished save (rank 0) and say what is left to resume from."""
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    previous = newest_checkpoint(root) if root.is_dir() else None
    kept = (f"{previous.name} and {LATEST_FILE} are untouched (resume from them with "
            "checkpoint.resume=true run_dir=<this run>)" if previous else
            "there is no earlier checkpoint")
    return CheckpointWriteError(
        f"the checkpoint of step {step} could not be written to {root} ({reason}); the "
        f"unfinished save was removed and {kept}; free space there or point output_dir / "
        "run_dir at a larger file system")


def run_phases(save, phases) -> None:
    """Each phase on every rank, then every rank's outcome shared: a refusal anywhere removes
    the unfinished save (`save`: a `publish.PendingSave`) and stops every rank with one
    `CheckpointWriteError`."""
    for phase in phases:
        reason = agree(attempt(phase, save.tmp))
        if reason:
            raise abandon(save.tmp, save.root, save.state.step, reason)

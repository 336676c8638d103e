"""Save a run: Megatron's `dist_checkpointing.save` of the sharded state dicts, published
atomically as `<root>/step_NNNNNNN`.

`save_checkpoint` is the one entry: it writes synchronously here (`_write_sharded`), or starts
an asynchronous write (`async_save.py`) with `checkpoint.async_save`, in phases whose outcome
every rank shares (`disk_errors.py`), and publishes the step once every rank's files are
complete (`publish.py`). A save is refused while `train_step` is under way: checkpoints sit on
optimizer-step boundaries.
"""

from __future__ import annotations

from pathlib import Path

import torch
from megatron.core import dist_checkpointing

from trainer.checkpoint import (
    async_save,
    disk_errors,
    fsdp_dtensor,
    megatron_fixes,
    publish,
    state_dicts,
)
from trainer.checkpoint.format import FSDP_DTENSOR, format_of
from trainer.checkpoint.publish import PendingSave
from trainer.state import RunState


def _write_sharded(session, state: RunState, path: Path) -> None:
    """Megatron's synchronous save of everything the checkpoint holds into `path` (Megatron
    FSDP's DTensors as `fsdp_dtensor`, `fsdp_dtensor.py`)."""
    if format_of(session.cfg) == FSDP_DTENSOR:
        fsdp_dtensor.write(session, state, path)
        return
    metadata = state_dicts.content_metadata(session.cfg)
    with megatron_fixes.parameters_gathered(session.model):
        sharded = state_dicts.sharded_checkpoint(session, state, metadata)
        with megatron_fixes.in_process_write_results(), megatron_fixes.writer_errors_unlogged():
            dist_checkpointing.save(sharded, str(path), state_dicts.save_strategy(),
                                    content_metadata=metadata)


def save_checkpoint(session, directory: str | Path) -> Path:
    """Write model, optimizer, scheduler and the run state after `session.state.step` steps,
    and publish it atomically as `<directory>/step_NNNNNNN` (`publish.py`); returns that path.
    With `checkpoint.async_save` the shards are written in the background and the step is
    published by a later `async_save.finish_saves`.

    Only between optimizer steps: `train_step` marks the session while a step is in progress,
    and a save then is refused (a programming error: the run loop saves after the step). A file
    system that refuses a phase (full, over quota, read-only) on any rank stops every rank with
    one `CheckpointWriteError`, after the unfinished `.tmp-` save is removed: the previous step
    and `latest` are never touched before the new step is complete.
    """
    if session.mid_step:
        raise RuntimeError("save_checkpoint inside an optimizer step; save after train_step")
    if session.cfg.checkpoint.async_save:
        async_save.finish_saves(session, blocking=True)  # one save in flight at a time
    state: RunState = session.capture_state()
    save = PendingSave(Path(directory), state, session.cfg.checkpoint.format)
    writes = ((lambda: async_save.start_async_write(session, save))
              if session.cfg.checkpoint.async_save
              else (lambda: _write_sharded(session, state, save.tmp)))
    rank0 = torch.distributed.get_rank() == 0
    # fsdp_dtensor's marker is written once every rank's files are (a phase of its own)
    marker = ((lambda: fsdp_dtensor.write_marker(save.tmp)),) if format_of(
        session.cfg) == FSDP_DTENSOR else ()
    disk_errors.run_phases(save, (lambda: save.tmp.mkdir(parents=True) if rank0 else None,
                                  writes, *marker))
    if not session.cfg.checkpoint.async_save:
        publish.publish(session, save)
    return save.final

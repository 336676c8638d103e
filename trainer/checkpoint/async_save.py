"""Asynchronous saves (`checkpoint.async_save`): training goes on while a forked writer writes.

Megatron Core's asynchronous distributed save: `dist_checkpointing.save(...,
async_sharded_save=True)` plans the save and returns an `AsyncRequest` (serialization.py:
465-470) instead of writing; `AsyncCallsQueue.schedule_async_request` forks a writer process
for it (TemporalAsyncCaller, strategies/async_utils.py:249-284: the fork is a copy-on-write
snapshot, so training may go on changing the weights); `maybe_finalize_async_calls` checks
with an all-reduce whether every rank's writer has exited (async_utils.py:286-316) and then
runs the request's finalize functions on every rank: torch DCP's (the write results of every
rank gathered, `.metadata`), Megatron's `metadata.json` (serialization.py:446-453) and ours,
`publish.publish`, appended last. So `latest` moves only once every rank's files are complete,
and a crash before then leaves the `.tmp-` directory, which nothing loads. The loop checks
after every step and blocks before the next save and at the end of the run (`finish_saves`).
The writer's speed-ups (results queue forked up front, views copied in the writer, not in the
step) are `megatron_fixes` entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.core import dist_checkpointing

from trainer.checkpoint import disk_errors, megatron_fixes, publish, state_dicts

if TYPE_CHECKING:
    from trainer.checkpoint.publish import PendingSave


class AsyncSaves:
    """A session's asynchronous saves: Megatron's queue, a fully parallel save strategy with its
    plan cached across saves (`save_strategy(cached=True)`), and the saves in flight."""

    def __init__(self):
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        megatron_fixes.forked_results_queue()
        self.queue = AsyncCallsQueue(persistent=False)
        self.strategy = state_dicts.save_strategy(cached=True)
        self.started = 0
        self.in_flight: list[PendingSave] = []


def _async_saves(session) -> AsyncSaves:
    if getattr(session, "async_saves", None) is None:
        session.async_saves = AsyncSaves()
    return session.async_saves


def start_async_write(session, save: PendingSave) -> None:
    """Plan the save, append the publication to its finalisation and start its writer."""
    saves = _async_saves(session)
    metadata = state_dicts.content_metadata(session.cfg)
    with megatron_fixes.parameters_gathered(session.model):
        sharded = state_dicts.sharded_checkpoint(session, save.state, metadata)
        # The sharding is validated on the first save only; the later ones save the content
        # metadata unvalidated, so without its process group.
        with megatron_fixes.views_uncopied():
            request = dist_checkpointing.save(
                sharded, str(save.tmp), saves.strategy,
                content_metadata=megatron_fixes.metadata_without_process_group(metadata),
                validate_access_integrity=saves.started == 0,
                async_sharded_save=True, async_strategy="mcore")
        request = megatron_fixes.views_copied_in_writer(request)
        writing = tuple(s.tmp for s in saves.in_flight)
        request.add_finalize_fn(lambda: publish.publish(session, save, writing))
        with megatron_fixes.writer_errors_unlogged():  # the forked writer keeps the raised level
            saves.queue.schedule_async_request(request)
    saves.in_flight.append(save)
    saves.started += 1


def finish_saves(session, *, blocking: bool) -> None:
    """Publish the asynchronous saves whose writers have finished on every rank (all of them,
    waiting, when `blocking`). A collective: every rank calls it at the same point. A write the
    file system refused stops every rank with the one `CheckpointWriteError`."""
    saves = getattr(session, "async_saves", None)
    if saves is None or not saves.in_flight:
        return
    oldest = saves.in_flight[0]
    reason = disk_errors.agree(disk_errors.attempt(
        lambda: saves.queue.maybe_finalize_async_calls(blocking=blocking), oldest.tmp))
    if reason:
        saves.in_flight.clear()
        raise disk_errors.abandon(oldest.tmp, oldest.root, oldest.state.step, reason)
    del saves.in_flight[:len(saves.in_flight) - saves.queue.get_num_unfinalized_calls()]

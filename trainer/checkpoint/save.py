"""Megatron distributed checkpoints (`torch_dist`): save a run, load weights into any layout.

Order follows Megatron-LM's: content metadata -> model sharded state dict -> optimizer sharded
state dict -> `dist_checkpointing.save`. Tensors are keyed by global names (layer numbers
include the pipeline offset), so weights saved from one layout load into any other.
A full checkpoint holds model, optimizer, scheduler and the typed `RunState` (step, consumed
samples and tokens, data position, plugin states; each rank's RNG streams as a sharded object),
so resuming restores all of it; with fp16 the optimizer's part holds the loss scaler's scale,
growth tracker and hysteresis tracker (`grad_scaler` in Megatron's optimizer state dict,
optimizer/optimizer.py:1133-1134 and 1208-1213). Megatron Core 0.19.2 needs four fixes on the
distributed-optimizer load path; they are applied here, around Megatron's own calls, without
editing the installed package. `docs/checkpoints.md` lists each defect with its file:line.

Publication is atomic so that a crash never leaves a half-written checkpoint under a final name:
a save is written to `step_NNNNNNN.tmp-<token>` (one token for all ranks), renamed to
`step_NNNNNNN` by rank 0 once every rank finished, and only then is `latest` replaced (write to
a temporary file, rename). A crash at any point leaves the previous checkpoint or the new one as
the newest complete step, which is what a resume picks (the names on disk and `newest_checkpoint`
are in `format.py`). `checkpoint.keep_last` rotation runs after
publication and never deletes the step this run resumed from. Before the rename, rank 0 writes
`run.json` (counters, layout, versions, tokenizer, resolved config, size and CRC-32 of every
file, each rank checksumming its own), which the launching process checks before a later start
(`manifest.py`, `preflight.py`).
A save is refused while `train_step` is under way: checkpoints sit on optimizer-step boundaries.

Loading unpickles no code where torch allows it: non-tensor objects go through the restricted
`weights_only` unpickler (`_weights_only_objects`); only torch DCP's own `.metadata` index is a
plain pickle (docs/checkpoints.md, "Untrusted checkpoints"). A resume takes this run's learning
rates and Adam settings and its schedule, with the position (samples consumed) from the save.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import platform
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.strategies.torch import MCoreLoadPlanner
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException

from plugins.protocol.errors import UserError
from recipes.config.io import config_dict
from recipes.config.schema import RunConfig
from trainer.checkpoint.format import (
    LATEST_FILE,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    TMP_INFIX,
    complete_steps,
    is_checkpoint,
    newest_checkpoint,
    step_name,
    step_of,
    step_of_unfinished,
    unfinished_saves,
)
from trainer.checkpoint.manifest import file_record, layout_record, tokenizer_identity
from trainer.state import RngState, RunState


def content_metadata(cfg: RunConfig) -> dict:
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if cfg.optimizer.distributed:
        metadata["distrib_optim_sharding_type"] = cfg.checkpoint.optimizer_format
    return metadata


def _model_key(index: int, num_chunks: int) -> str:
    return "model" if num_chunks == 1 else f"model{index}"


def model_sharded_state_dict(model: list[torch.nn.Module], metadata: dict) -> dict:
    """Keys of the bare GPT modules (as Megatron-LM saves them): DDP wrapping adds no prefix."""
    return {
        _model_key(i, len(model)): chunk.sharded_state_dict(metadata=metadata)
        for i, chunk in enumerate(unwrap_model(model))
    }


@contextlib.contextmanager
def parameters_gathered(model: list):
    """With overlapped param all-gather the updated weights arrive in the next forward's
    pre-hook; finish that gather first (as Megatron-LM does) so the saved weights are current."""
    overlapped = [
        chunk for chunk in model
        if chunk.ddp_config.use_distributed_optimizer and chunk.ddp_config.overlap_param_gather
    ]
    for chunk in overlapped:
        chunk.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        for chunk in overlapped:
            chunk.enable_forward_pre_hook()


def _rng_sharded(rng: RngState | None, world_size: int) -> ShardedObject:
    """This rank's RNG streams as one element of a world-sized sharded object."""
    rank = torch.distributed.get_rank()
    data = None if rng is None else rng.as_dict()
    return ShardedObject("rng_state", data, (world_size,), (rank,), replica_id=0)


def _shared_token(step: int) -> str:
    """A name part unique to this save and identical on every rank (rank 0 draws it)."""
    token = [f"{step}-{uuid.uuid4().hex[:8]}" if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)
    return token[0]


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


def _point_latest(final: Path) -> None:
    """Rank 0, last: `latest` names the new step (written aside, then renamed over)."""
    root = final.parent
    marker = root / f"{LATEST_FILE}{TMP_INFIX}{os.getpid()}"
    with open(marker, "w", encoding="utf-8") as f:
        f.write(final.name)
        f.flush()
        os.fsync(f.fileno())
    marker.replace(root / LATEST_FILE)
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


# --- Save/load speed (figures in docs/checkpoints.md) ------------------------------------------


@contextlib.contextmanager
def in_process_write_results():
    """A synchronous save hands its write results over an in-process queue. Megatron's default
    is a multiprocessing Manager queue started with `spawn` on the first save of each process
    (strategies/filesystem_async.py:52-66, called at :200); the Manager's fresh interpreter
    imports torch to unpickle the first `put` (:345), which cost 3-4 s of every first save."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    previous = filesystem_async._results_queue
    filesystem_async._results_queue = queue.Queue()
    try:
        yield
    finally:
        filesystem_async._results_queue = previous


@contextlib.contextmanager
def gc_frozen():
    """Megatron ends the fully_reshardable optimizer state with a full `gc.collect()`
    (optimizer/distrib_optimizer.py:1569), 0.4 s over a trainer's heap on save and on load.
    Objects older than the call are frozen (`gc.freeze`, O(1)), so it scans only new ones."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def save_strategy(*, cached: bool = False):
    """DP replicas split the writing (Megatron-LM's `--ckpt-fully-parallel-save`): otherwise
    the first replica writes every replicated tensor, e.g. all of a fully_reshardable
    optimizer state, while the others wait (strategies/fully_parallel.py:46-138). `cached`
    keeps the save plan and its distribution across saves of one layout (repeated saves of a
    run: what an asynchronous save would use)."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    return FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy(cached_metadata=cached), dp_group,
        do_cache_distribution=cached)


@contextlib.contextmanager
def writer_errors_unlogged():
    """Megatron's writer logs a failed write itself, twice, before handing it on
    (strategies/filesystem_async.py:289 "Local worker ... encountered an error" and :331 "An
    error is caught while starting worker ..."); the failure reaches us as the exception, so
    a full disk is our one line only. Its logger is raised above ERROR for the save."""
    import logging

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    writer_logger = logging.getLogger(filesystem_async.__name__)
    previous = writer_logger.level
    writer_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        writer_logger.setLevel(previous)


def _write_sharded(session, state: RunState, path: Path) -> None:
    metadata = content_metadata(session.cfg)
    with parameters_gathered(session.model):
        sharded = sharded_checkpoint(session, state, metadata)
        with in_process_write_results(), writer_errors_unlogged():
            dist_checkpointing.save(sharded, str(path), save_strategy(),
                                    content_metadata=metadata)


def sharded_checkpoint(session, state: RunState, metadata: dict, *,
                       freeze_gc: bool = True) -> dict:
    """Everything a full checkpoint holds, as the sharded dict Megatron saves: the model, the
    optimizer, the scheduler and the run state (the shared part once, each rank's RNG streams
    as a world-sized sharded object). Call it under `parameters_gathered`."""
    sharded = model_sharded_state_dict(session.model, metadata)
    with gc_frozen() if freeze_gc else contextlib.nullcontext():
        sharded["optimizer"] = session.optimizer.sharded_state_dict(sharded, metadata=metadata)
    sharded["scheduler"] = session.scheduler.state_dict()
    sharded["run_state"] = state.common()
    sharded["rng_state"] = _rng_sharded(state.rng, state.world_size)
    return sharded


def _versions() -> dict[str, str]:
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
        "versions": _versions(), "tokenizer": tokenizer_identity(cfg),
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


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # the disk said no


class CheckpointWriteError(UserError):
    """A save the file system refused (full, over quota, read-only): every rank stops with it."""


def _disk_error(error: BaseException) -> OSError | None:
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


PROBE_BYTES = 1 << 20


def _refuses_a_write(directory: Path) -> OSError | None:
    """Whether `directory`'s file system has under 1 MiB free or refuses a 1 MiB write now.
    Megatron's writer threads hand their own exception on as text only (its
    dist_checkpointing/strategies/filesystem_async.py:284-291 logs it, then fails an assert on
    its type), and torch's stream writer reports a full disk as a position mismatch, so a
    failed save asks the disk itself."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage(directory).free < PROBE_BYTES:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error if error.errno in DISK_ERRNOS else None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _attempt(step: Callable[[], None], directory: Path) -> str | None:
    """Run one phase of a save; the file system's refusal as words, other errors raised."""
    try:
        step()
    except CheckpointWriteError:  # a publication that already stopped every rank
        raise
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        disk = _disk_error(error) or _refuses_a_write(
            directory if directory.is_dir() else directory.parent)
        if disk is None:
            raise
        return f"{disk.strerror or os.strerror(disk.errno)}"
    return None


def _agree(reason: str | None) -> str | None:
    """Every rank's outcome of a save phase, shared (it is also the phase's barrier): the first
    refusal any rank met, or None."""
    gathered: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, reason)
    return next((item for item in gathered if item), None)


def _abandon(tmp: Path, root: Path, step: int, reason: str) -> CheckpointWriteError:
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


def save_checkpoint(session, directory: str | Path) -> Path:
    """Write model, optimizer, scheduler and the run state after `session.state.step` steps,
    and publish it atomically as `<directory>/step_NNNNNNN` (module docstring); returns that
    path. With `checkpoint.async_save` the shards are written in the background and the step
    is published by a later `finish_saves` (see "Asynchronous saves" below).

    Only between optimizer steps: `train_step` marks the session while a step is in progress,
    and a save then is refused (a programming error: the run loop saves after the step). A file
    system that refuses a phase (full, over quota, read-only) on any rank stops every rank with
    one `CheckpointWriteError`, after the unfinished `.tmp-` save is removed: the previous step
    and `latest` are never touched before the new step is complete.
    """
    if session.mid_step:
        raise RuntimeError("save_checkpoint inside an optimizer step; save after train_step")
    if session.cfg.checkpoint.async_save:
        finish_saves(session, blocking=True)  # one save in flight at a time
    state: RunState = session.capture_state()
    save = _Save(Path(directory), state)
    writes = ((lambda: _start_async_write(session, save)) if session.cfg.checkpoint.async_save
              else (lambda: _write_sharded(session, state, save.tmp)))
    rank0 = torch.distributed.get_rank() == 0
    _run_phases(save, (lambda: save.tmp.mkdir(parents=True) if rank0 else None, writes))
    if not session.cfg.checkpoint.async_save:
        _publish(session, save)
    return save.final


class _Save:
    """One save: where it is written (`.tmp-<token>`, one token for all ranks) and published."""

    def __init__(self, root: Path, state: RunState):
        self.root, self.state = root, state
        self.final = root / step_name(state.step)
        self.tmp = root / f"{self.final.name}{TMP_INFIX}{_shared_token(state.step)}"


def _run_phases(save: _Save, phases) -> None:
    """Each phase on every rank, then every rank's outcome shared: a refusal anywhere removes
    the unfinished save and stops every rank with one `CheckpointWriteError`."""
    for phase in phases:
        reason = _agree(_attempt(phase, save.tmp))
        if reason:
            raise _abandon(save.tmp, save.root, save.state.step, reason)


def _publish(session, save: _Save, writing: tuple[Path, ...] = ()) -> None:
    """Every rank's files are complete: checksums into `run.json`, then rank 0 renames the
    step into place, points `latest` at it and rotates."""
    _run_phases(save, (lambda: _write_manifest(session, save.state, save.tmp),))
    if torch.distributed.get_rank() == 0:
        _rename_into_place(save.tmp, save.final)
        _point_latest(save.final)
        _rotate(save.root, session.cfg.checkpoint.keep_last, session.resumed_from, writing)
    torch.distributed.barrier()


# --- Asynchronous saves (`checkpoint.async_save`) -----------------------------------------------
#
# Megatron Core's asynchronous distributed save: `dist_checkpointing.save(...,
# async_sharded_save=True)` plans the save and returns an `AsyncRequest` (serialization.py:
# 465-470) instead of writing; `AsyncCallsQueue.schedule_async_request` forks a writer process
# for it (TemporalAsyncCaller, strategies/async_utils.py:249-284: the fork is a copy-on-write
# snapshot, so training may go on changing the weights); `maybe_finalize_async_calls` checks
# with an all-reduce whether every rank's writer has exited (async_utils.py:286-316) and then
# runs the request's finalize functions on every rank: torch DCP's (the write results of every
# rank gathered, `.metadata`), Megatron's `metadata.json` (serialization.py:446-453) and ours,
# `_publish`, appended last. So `latest` moves only once every rank's files are complete, and a
# crash before then leaves the `.tmp-` directory, which nothing loads. The loop checks after
# every step and blocks before the next save and at the end of the run (`finish_saves`).


def forked_results_queue() -> None:
    """The writer hands its results over Megatron's process-wide queue, by default a
    multiprocessing Manager spawned inside the first save (strategies/filesystem_async.py:
    52-66), whose fresh interpreter imports torch (3-4 s of that save's step). Forked from
    this process instead, up front, it costs a fork."""
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


class AsyncSaves:
    """A session's asynchronous saves: Megatron's queue, a fully parallel save strategy with its
    plan cached across saves (`save_strategy(cached=True)`), and the saves in flight."""

    def __init__(self):
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        forked_results_queue()
        self.queue = AsyncCallsQueue(persistent=False)
        self.strategy = save_strategy(cached=True)
        self.started = 0
        self.in_flight: list[_Save] = []


def is_storage_view(tensor: torch.Tensor) -> bool:
    """A tensor that is a piece of a larger storage (a parameter in its DDP buffer): torch.save
    would write the whole storage (the test Megatron uses, strategies/filesystem_async.py:165)."""
    return tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()


def compact_buckets(buckets: list) -> list:
    """Megatron's write buckets, `(path, name, (bytes items, [(item, tensor)]))`, with every CPU
    tensor that is a view of a larger storage replaced by its own copy."""
    return [(path, name, (byte_items, [
        (item, tensor.clone() if tensor.device.type == "cpu" and is_storage_view(tensor)
         else tensor) for item, tensor in tensor_items]))
        for path, name, (byte_items, tensor_items) in buckets]


@contextlib.contextmanager
def views_uncopied():
    """The writer's `prepare_write_data` copies every CPU tensor that is a view (on a CPU rank:
    every parameter, a view of its DDP buffer; strategies/filesystem_async.py:146-166, :180),
    in the step. A forked writer does not need the copy for consistency (the fork is the
    snapshot, async_utils.py:270-275), only for the bytes it writes: while this is active,
    such views reach the write buckets uncopied, and `_copied_in_writer` makes the copies in
    the writer process, after the fork."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync,
    )

    prepare = FileSystemWriterAsync.prepare_write_data

    def prepare_without_copies(writer, plan, planner):
        views: dict[int, torch.Tensor] = {}
        resolve = planner.resolve_data

        def resolve_placeholder(item):
            data = resolve(item)
            if isinstance(data, torch.Tensor) and data.device.type == "cpu" and \
                    is_storage_view(data):
                views[id(item)] = data
                return data.new_empty(0)  # what Megatron hands on without a copy
            return data

        planner.resolve_data = resolve_placeholder
        try:
            prepare(writer, plan, planner)
        finally:
            del planner.resolve_data
        writer.write_buckets = [(path, name, (byte_items, [
            (item, views.get(id(item), tensor)) for item, tensor in tensor_items]))
            for path, name, (byte_items, tensor_items) in writer.write_buckets]

    FileSystemWriterAsync.prepare_write_data = prepare_without_copies
    try:
        yield
    finally:
        FileSystemWriterAsync.prepare_write_data = prepare


def _copied_in_writer(request):
    """The request with its write function compacting the buckets first (`compact_buckets`),
    in the forked writer: Megatron calls it as `async_fn(rank, write_buckets, results_queue)`
    (strategies/filesystem_async.py:220-224, the buckets preloaded at async_utils.py:264-269)."""
    write = request.async_fn
    if write is None:
        return request

    def write_compacted(rank, buckets, *rest, **kwargs):
        return write(rank, compact_buckets(buckets), *rest, **kwargs)

    return request._replace(async_fn=write_compacted)


def _async_saves(session) -> AsyncSaves:
    if getattr(session, "async_saves", None) is None:
        session.async_saves = AsyncSaves()
    return session.async_saves


def _start_async_write(session, save: _Save) -> None:
    """Plan the save, append the publication to its finalisation and start its writer."""
    saves = _async_saves(session)
    metadata = content_metadata(session.cfg)
    with parameters_gathered(session.model):
        sharded = sharded_checkpoint(session, save.state, metadata)
        # A fresh content_metadata: the sharded dicts leave a process group in `metadata`,
        # which only the validation branch strips (dist_checkpointing/state_dict_utils.py:
        # 44-49) and the writer cannot pickle; the sharding is validated on the first save.
        with views_uncopied():
            request = dist_checkpointing.save(
                sharded, str(save.tmp), saves.strategy,
                content_metadata=content_metadata(session.cfg),
                validate_access_integrity=saves.started == 0,
                async_sharded_save=True, async_strategy="mcore")
        request = _copied_in_writer(request)
        writing = tuple(s.tmp for s in saves.in_flight)
        request.add_finalize_fn(lambda: _publish(session, save, writing))
        with writer_errors_unlogged():  # the forked writer keeps the raised level
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
    reason = _agree(_attempt(lambda: saves.queue.maybe_finalize_async_calls(blocking=blocking),
                             oldest.tmp))
    if reason:
        saves.in_flight.clear()
        raise _abandon(oldest.tmp, oldest.root, oldest.state.step, reason)
    del saves.in_flight[:len(saves.in_flight) - saves.queue.get_num_unfinalized_calls()]


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """One step directory, or the step a checkpoint root resumes from: the one `latest` names
    when complete, else the newest complete one (`.tmp-` saves ignored). `checkpoint.load` was
    checked before any rank started (`preflight.py`); a root without a complete step
    here is a programming error."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    newest = newest_checkpoint(path)
    if newest is None:
        raise FileNotFoundError(f"{path} holds no complete checkpoint")
    return newest


def _load_bytes_weights_only(planner, read_item, value) -> None:
    """`DefaultLoadPlanner.load_bytes` (torch/distributed/checkpoint/default_planner.py:381-392)
    with `weights_only=True`: a checkpoint's non-tensor objects (the RNG streams, Megatron's
    optimizer param groups) are unpickled by torch's restricted unpickler, which builds tensors,
    numbers, strings and containers and refuses anything else instead of running it."""
    try:
        loaded = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UntrustedCheckpointError(
            f"the checkpoint object {read_item.dest_index.fqn} holds pickled code or classes "
            f"({_refused_global(error)}), which are not loaded; load only checkpoints this "
            "project saved, from a source you trust"
        ) from None
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict,
                    planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


def _refused_global(error: Exception) -> str:
    """The global torch's unpickler refused, e.g. `GLOBAL builtins.open`."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ")[:120]
    return type(error).__name__


class UntrustedCheckpointError(UserError):
    """A checkpoint object that the restricted unpickler refuses (one line for the user)."""


@contextlib.contextmanager
def _weights_only_objects():
    """While loading: Megatron's load planner unpickles byte objects with weights_only."""
    original = MCoreLoadPlanner.load_bytes
    MCoreLoadPlanner.load_bytes = _load_bytes_weights_only
    try:
        yield
    finally:
        MCoreLoadPlanner.load_bytes = original


def _load(template: dict, path: Path) -> dict:
    """`dist_checkpointing.load` with weights-only objects; a refused object is raised as the
    one-line `UntrustedCheckpointError`, not inside torch's `CheckpointException` report."""
    try:
        with _weights_only_objects():
            return dist_checkpointing.load(template, str(path))
    except CheckpointException as failure:
        for wrapped in failure.failures.values():
            error = wrapped[0] if isinstance(wrapped, tuple) else wrapped
            if isinstance(error, UntrustedCheckpointError):
                raise error from None
        raise


def load_model_weights(path: str | Path, model: list) -> None:
    """Load only the weights (any layout) into this rank's model chunks."""
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    template = model_sharded_state_dict(model, metadata)
    loaded = _load(template, path)
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[_model_key(i, len(model))])


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _is_distributed(optimizer) -> bool:
    return hasattr(optimizer, "_init_optimizer_states_with_dummy_values")


def _create_state_if_missing(optimizer) -> None:
    """Fix 1: a fresh distributed optimizer has no state to describe (`assert len(steps) == 1`,
    distrib_optimizer.py:839); Megatron's own dummy step creates it (replaced by the load)."""
    for inner in _inner_optimizers(optimizer):
        if _is_distributed(inner) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


@contextlib.contextmanager
def _keep_step_out_of_param_state(optimizer):
    """Fix 2: the per-parameter copy (distrib_optimizer.py:1193) expects a `step` tensor the
    loaded dict lacks (KeyError), or, dp_reshardable, overwrites the right step with the
    receiving optimizer's dummy one. Handing it the parameter's own step makes that a no-op;
    the step itself comes from the param groups, as Megatron's load sets it."""
    patched = []
    for inner in _inner_optimizers(optimizer):
        if not _is_distributed(inner):
            continue
        original = inner._set_main_param_and_optimizer_states

        def without_step(model_param, tensors, _inner=inner, _original=original):
            group_index, group_order = _inner.model_param_group_index_map[model_param]
            main_param = _inner.optimizer.param_groups[group_index]["params"][group_order]
            own_step = _inner.optimizer.state[main_param].get("step")
            if own_step is not None:
                tensors = {**tensors, "step": own_step}
            return _original(model_param, tensors)

        inner._set_main_param_and_optimizer_states = without_step
        patched.append(inner)
    try:
        yield
    finally:
        for inner in patched:
            del inner._set_main_param_and_optimizer_states


def _give_each_param_its_own_step(optimizer) -> None:
    """Fix 4 (silent): the load gives every parameter one shared `step` tensor
    (distrib_optimizer.py:1028); torch's foreach Adam then increments it once per parameter."""
    for inner in _inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for state in torch_optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].detach().clone()


def _this_runs_hyperparameters(cfg: RunConfig) -> dict:
    o = cfg.optimizer
    return {"max_lr": o.lr, "min_lr": o.min_lr, "betas": (o.adam_beta1, o.adam_beta2),
            "eps": o.adam_eps}


def _adopt_hyperparameters(loaded, values: dict) -> None:
    """Resume with this run's learning rates and Adam settings, not the saved ones.

    Megatron's param groups carry `max_lr`/`min_lr`, which the scheduler reads
    (optimizer_param_scheduler.py `get_lr`), and the distributed optimizer matches saved groups
    to its own by them (distrib_optimizer.py:941-970, a KeyError when the lr changed); torch's
    `load_state_dict` would restore the saved betas and eps. Every group of this project's
    optimizer uses the config's values (no per-group overrides), so they are written into each
    saved group before the load; a changed value is stated before launch."""
    if isinstance(loaded, dict):
        for key, value in loaded.items():
            if key == "param_groups" and isinstance(value, list):
                for group in value:
                    group.update({k: v for k, v in values.items() if k in group})
            else:
                _adopt_hyperparameters(value, values)
    elif isinstance(loaded, list):
        for value in loaded:
            _adopt_hyperparameters(value, values)


def _saved_world_size(path: Path) -> int:
    """World size of the run that wrote the checkpoint (from its common state)."""
    common = dist_checkpointing.load_common_state_dict(str(path))
    return int(common["run_state"]["world_size"])


def load_checkpoint(session, path: str | Path) -> RunState:
    """Restore weights, optimizer, scheduler and run state; returns the restored `RunState`.

    Each rank's RNG streams come back when the world size is the one that saved them; under
    another layout the ranks keep their freshly seeded streams (nothing to map them onto).
    """
    path = resolve_checkpoint_dir(path)
    metadata = dist_checkpointing.load_content_metadata(str(path)) or {}
    model, optimizer = session.model, session.optimizer
    _create_state_if_missing(optimizer)
    template = model_sharded_state_dict(model, metadata)
    with gc_frozen():
        template["optimizer"] = optimizer.sharded_state_dict(
            template, is_loading=True, metadata=metadata
        )
    world_size = torch.distributed.get_world_size()
    same_world = _saved_world_size(path) == world_size
    if same_world:
        template["rng_state"] = _rng_sharded(RngState.capture(), world_size)
    loaded = _load(template, path)
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(loaded[_model_key(i, len(model))])
    # Fix 3: the dp_reshardable loader copies into leaf params without no_grad
    # (distrib_optimizer.py:2061); fp32 then fails with an in-place-on-leaf error.
    _adopt_hyperparameters(loaded["optimizer"], _this_runs_hyperparameters(session.cfg))
    with torch.no_grad(), _keep_step_out_of_param_state(optimizer):
        optimizer.load_state_dict(loaded["optimizer"])
    _give_each_param_its_own_step(optimizer)
    session.scheduler.load_state_dict(loaded["scheduler"])
    rng = RngState.from_dict(loaded["rng_state"]) if same_world else None
    return RunState.from_common(loaded["run_state"], rng)

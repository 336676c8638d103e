"""Every change this project makes to Megatron Core's behaviour on the checkpoint paths, by name.

Megatron Core 0.19.2 is used unmodified; where its save or load does the wrong thing here (a
defect on the torch-Adam path the CPU takes, a slow default, a pickle that runs code, two log
lines around an error we report ourselves), a function or context manager below works around
it from the outside, around Megatron's own calls. Each is one named entry of `FIXES`: the
Megatron symbol and file:line it works around, one line on why, and what applies it
(`docs/checkpoints.md` tells the longer stories). The rest of the package calls them only
through this module, so a fix is found, and can be left out, by its name.

`skipping(names)` leaves fixes out for the duration (each then does nothing, or hands its
argument back unchanged): the self-tests (tests/unit/test_megatron_fixes.py; for those that
need a process group with the distributed optimizer tests/dist/test_load_path_fixes.py, and for
the disk probe tests/dist/test_full_disk.py) show what breaks or differs without each one.
Each fix is an entry of the one table of patches (`trainer/megatron_patches.py`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plugins.protocol.errors import UserError
from trainer.patch import Patch, refuse_unknown


@dataclass(frozen=True)
class Fix:
    """One workaround: its entry in the table of patches (name, what of Megatron it works
    around, why, its self-test) and the function or context manager that applies it."""

    patch: Patch
    apply: Callable[..., Any]
    context: bool  # a context manager entered around Megatron's call (else a call)


FIXES: dict[str, Fix] = {}
# Where each fix shows what breaks without it: in one process, or (a fix of the distributed
# optimizer's load path, or of a full disk) in a run of ranks.
UNIT_SELF_TEST = "tests/unit/test_megatron_fixes.py"
LOAD_PATH_SELF_TEST = "tests/dist/test_load_path_fixes.py"
FULL_DISK_SELF_TEST = "tests/dist/test_full_disk.py"
_skipped: frozenset[str] = frozenset()


def _unchanged(argument: Any, *_: Any, **__: Any) -> Any:
    return argument


def _fix(name: str, *, works_around: str, why: str, context: bool = False,
         when_skipped: Callable[..., Any] | None = None, self_test: str = UNIT_SELF_TEST):
    """Register the decorated function as the fix `name`. Skipped (`skipping`), a context
    manager enters nothing and a call does nothing, or what `when_skipped` does instead."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def applied(*args: Any, **kwargs: Any) -> Any:
            if name not in _skipped:
                return function(*args, **kwargs)
            if when_skipped is not None:
                return when_skipped(*args, **kwargs)
            return contextlib.nullcontext() if context else None

        FIXES[name] = Fix(Patch(name, works_around, why, self_test), applied, context)
        return applied

    return register


@contextlib.contextmanager
def skipping(names: Iterable[str]) -> Iterator[None]:
    """Leave the named fixes out while active (self-tests only). A forked writer inherits it."""
    global _skipped
    names = refuse_unknown("Megatron fixes", names, sorted(FIXES))
    previous, _skipped = _skipped, _skipped | names
    try:
        yield
    finally:
        _skipped = previous


# --- Saving -------------------------------------------------------------------------------


@_fix("params_gathered_before_save", self_test=LOAD_PATH_SELF_TEST, context=True,
      works_around="DistributedDataParallel's overlapped param all-gather, finished only in the "
                   "next forward's pre-hook (distributed/distributed_data_parallel.py:412, "
                   ":426-430)",
      why="a save right after a step would store the pre-update weights (Megatron-LM gathers "
          "first too, training/training.py:3045-3046)")
@contextlib.contextmanager
def parameters_gathered(model: list) -> Iterator[None]:
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


@_fix("gc_frozen", context=True,
      works_around="the full gc.collect() ending DistributedOptimizer's fully_reshardable state "
                   "(optimizer/distrib_optimizer.py:1569)",
      why="it scans the trainer's whole heap, 0.4 s on every save and load; frozen, only "
          "objects newer than the call are scanned")
@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Megatron ends the fully_reshardable optimizer state with a full `gc.collect()`
    (optimizer/distrib_optimizer.py:1569), 0.4 s over a trainer's heap on save and on load.
    Objects older than the call are frozen (`gc.freeze`, O(1)), so it scans only new ones."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@_fix("in_process_write_results", context=True,
      works_around="filesystem_async.get_write_results_queue, a multiprocessing Manager started "
                   "with spawn (dist_checkpointing/strategies/filesystem_async.py:52-66, called "
                   "at :200)",
      why="a synchronous save needs no other process; the spawned one imports torch to "
          "unpickle the first result (:357), 3-4 s of every process's first save")
@contextlib.contextmanager
def in_process_write_results() -> Iterator[None]:
    """A synchronous save hands its write results over an in-process queue. Megatron's default
    is a multiprocessing Manager queue started with `spawn` on the first save of each process
    (strategies/filesystem_async.py:52-66, called at :200); the Manager's fresh interpreter
    imports torch to unpickle the first `put` (:357), which cost 3-4 s of every first save."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    previous = filesystem_async._results_queue
    filesystem_async._results_queue = queue.Queue()
    try:
        yield
    finally:
        filesystem_async._results_queue = previous


@_fix("writer_errors_unlogged", context=True,
      works_around="FileSystemWriterAsync.write_preloaded_data_multithread's logger.error calls "
                   "(dist_checkpointing/strategies/filesystem_async.py:290 and :331)",
      why="a failed write is logged twice before it reaches us as the exception; a full disk "
          "is then our one line only")
@contextlib.contextmanager
def writer_errors_unlogged() -> Iterator[None]:
    """Megatron's writer logs a failed write itself, twice, before handing it on
    (strategies/filesystem_async.py:290 "Local worker ... encountered an error" and :331 "An
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


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # the disk said no
PROBE_BYTES = 1 << 20


@_fix("disk_asked_after_a_failed_write", self_test=FULL_DISK_SELF_TEST,
      works_around="the writer threads' exception handed on as text, then an assert on its type "
                   "(dist_checkpointing/strategies/filesystem_async.py:284-291, :330-332); "
                   "torch's stream writer reports a full disk as a position mismatch",
      why="the errno is lost, so only the disk itself can say a failed save was a full, "
          "over-quota or read-only file system (one line instead of a traceback)")
def disk_refusal(directory: Path) -> OSError | None:
    """Whether `directory`'s file system has under 1 MiB free or refuses a 1 MiB write now
    (the error it gives), asked after a save phase failed: Megatron's writer threads hand their
    own exception on as text only (its dist_checkpointing/strategies/filesystem_async.py:284-291
    logs it, then fails an assert on its type), and torch's stream writer reports a full disk
    as a position mismatch."""
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


# --- Asynchronous saves ---------------------------------------------------------------------


@_fix("forked_results_queue",
      works_around="filesystem_async.get_write_results_queue, a multiprocessing Manager spawned "
                   "inside the first asynchronous save (dist_checkpointing/strategies/"
                   "filesystem_async.py:52-66)",
      why="the spawned interpreter imports torch, 3-4 s of the step that starts the first "
          "save; forked from this process up front it costs a fork")
def forked_results_queue() -> None:
    """The writer hands its results over Megatron's process-wide queue, by default a
    multiprocessing Manager spawned inside the first save (strategies/filesystem_async.py:
    52-66), whose fresh interpreter imports torch (3-4 s of that save's step). Forked from
    this process instead, up front, it costs a fork.

    The forked manager ends with this rank (`end_with_parent`: a rank killed with SIGKILL would
    leave it, a copy of the rank's memory, running under init) and takes SIGTERM's default
    action again: it inherits the trainer's stop handler, which only notes the signal."""
    import multiprocessing
    import signal
    import threading
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from trainer.parent_watch import end_with_parent

    if filesystem_async._results_queue is not None:
        return
    rank, main = os.getpid(), threading.current_thread() is threading.main_thread()

    def as_own_process() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        end_with_parent(rank, signal.SIGKILL, forked_by_main_thread=main)

    manager = SyncManager(ctx=multiprocessing.get_context("fork"))
    manager.start(initializer=as_own_process)
    filesystem_async._results_queue = manager.Queue()


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


@_fix("views_uncopied", context=True,
      works_around="FileSystemWriterAsync.prepare_write_data, which copies every CPU tensor "
                   "that is a view (dist_checkpointing/strategies/filesystem_async.py:146-166, "
                   ":180)",
      why="on a CPU rank every parameter is a view of its DDP buffer, copied inside the "
          "training step; the forked writer is the snapshot and copies them itself "
          "(`views_copied_in_writer`)")
@contextlib.contextmanager
def views_uncopied() -> Iterator[None]:
    """The writer's `prepare_write_data` copies every CPU tensor that is a view (on a CPU rank:
    every parameter, a view of its DDP buffer; strategies/filesystem_async.py:146-166, :180),
    in the step. A forked writer does not need the copy for consistency (the fork is the
    snapshot, async_utils.py:270-275), only for the bytes it writes: while this is active,
    such views reach the write buckets uncopied, and `views_copied_in_writer` makes the copies
    in the writer process, after the fork."""
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


@_fix("views_copied_in_writer", when_skipped=_unchanged,
      works_around="the AsyncRequest's write function, called in the forked writer as "
                   "async_fn(rank, write_buckets, results_queue) (dist_checkpointing/strategies/"
                   "filesystem_async.py:220-224; buckets preloaded at async_utils.py:264-269)",
      why="with `views_uncopied`, torch.save would write each view's whole DDP buffer; the "
          "writer copies the views first, after the fork")
def views_copied_in_writer(request):
    """The request with its write function compacting the buckets first (`compact_buckets`),
    in the forked writer: Megatron calls it as `async_fn(rank, write_buckets, results_queue)`
    (strategies/filesystem_async.py:220-224, the buckets preloaded at async_utils.py:264-269)."""
    write = request.async_fn
    if write is None:
        return request

    def write_compacted(rank, buckets, *rest, **kwargs):
        return write(rank, compact_buckets(buckets), *rest, **kwargs)

    return request._replace(async_fn=write_compacted)


@_fix("metadata_without_process_group", when_skipped=_unchanged,
      works_around="the `dp_cp_group` the sharded state dicts add to the content metadata "
                   "(transformer/utils.py:247), stripped only on the validated path "
                   "(dist_checkpointing/state_dict_utils.py:44-49)",
      why="an asynchronous save validates its sharding once; the later ones would save a "
          "process group in the common state, which cannot be pickled")
def metadata_without_process_group(metadata: dict) -> dict:
    """The content metadata to save, without the process group the sharded state dicts put in
    it (Megatron's own cleaning, dist_checkpointing/utils.py:335-349)."""
    from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization

    return _clean_metadata_for_serialization(metadata)


# --- Loading --------------------------------------------------------------------------------


class UntrustedCheckpointError(UserError):
    """A checkpoint object that the restricted unpickler refuses (one line for the user)."""


def _refused_global(error: Exception) -> str:
    """The global torch's unpickler refused, e.g. `GLOBAL builtins.open`."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ")[:120]
    return type(error).__name__


# Classes the optimizer state names, as class references only: Megatron's hybrid-device
# optimizer (`optimizer.cpu_offload`) keeps its CPU and GPU optimizer classes in its param groups
# (optimizer/cpu_offloading/hybrid_optimizer.py:56-67), so they are saved with them.
OPTIMIZER_CLASSES = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)


def _load_bytes_weights_only(planner, read_item, value) -> None:
    """`DefaultLoadPlanner.load_bytes` (torch/distributed/checkpoint/default_planner.py:381-392)
    with `weights_only=True`: a checkpoint's non-tensor objects (the RNG streams, Megatron's
    optimizer param groups) are unpickled by torch's restricted unpickler, which builds tensors,
    numbers, strings and containers and refuses anything else instead of running it."""
    from torch.distributed.checkpoint._traverse import set_element

    try:
        with torch.serialization.safe_globals(list(OPTIMIZER_CLASSES)):
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


# The same reader for a plain torch DCP load (Megatron FSDP's fsdp_dtensor checkpoints).
load_bytes_weights_only = _load_bytes_weights_only


@_fix("weights_only_objects", context=True,
      works_around="MCoreLoadPlanner.load_bytes, torch DCP's DefaultLoadPlanner.load_bytes with "
                   "weights_only=False (torch/distributed/checkpoint/default_planner.py:381-392)",
      why="a tampered checkpoint's non-tensor objects would run pickled code on every rank; "
          "the restricted unpickler refuses it in one line")
@contextlib.contextmanager
def weights_only_objects() -> Iterator[None]:
    """While loading: Megatron's load planner unpickles byte objects with weights_only."""
    from megatron.core.dist_checkpointing.strategies.torch import MCoreLoadPlanner

    original = MCoreLoadPlanner.load_bytes
    MCoreLoadPlanner.load_bytes = _load_bytes_weights_only
    try:
        yield
    finally:
        MCoreLoadPlanner.load_bytes = original


# The four below sit on the branch taken when neither Transformer Engine's nor Apex's fused Adam
# imports, i.e. on CPU (`HAVE_APEX_OR_TE = False`, optimizer/distrib_optimizer.py:20-35): the
# inner optimizer is then torch's AdamW, which keeps a `step` tensor per parameter.


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _is_distributed(optimizer) -> bool:
    return hasattr(optimizer, "_init_optimizer_states_with_dummy_values")


def keeps_step_per_parameter(torch_optimizer) -> bool:
    """torch's Adam/AdamW (the CPU path, `HAVE_APEX_OR_TE = False`) keep a `step` tensor in
    each parameter's state; TE's and Apex's fused Adam keep it in the param groups."""
    return isinstance(torch_optimizer, torch.optim.Adam | torch.optim.AdamW)


def optimizer_state_before_first_update(optimizer) -> None:
    """Give an optimizer that has not updated yet (fp16: every step so far skipped by the loss
    scaler) the state its first update starts from, so that it can be saved and resumed; the
    save paths of every format call it (not a fix of its own: it only supplies what Megatron
    itself makes at the first update).

    Without state, the distributed optimizer's save fails (`DistributedOptimizer.state_dict`'s
    `assert len(steps) == 1`, optimizer/distrib_optimizer.py:839), and a plain optimizer's or
    Megatron FSDP's checkpoint lacks the Adam state its load template asks for (the template
    comes from `sharded_state_dict(..., is_loading=True)`, which first makes dummy state:
    `init_state_fn`, optimizer/optimizer.py:1145-1146 and :1361-1362, and
    `_init_optimizer_states_with_dummy_values`, distrib_optimizer.py:1642-1643: a KeyError or
    DCP's `Missing key` on resume). The state made here is Megatron's own `init_state_fn`
    (optimizer/__init__.py:588-595: zero `exp_avg` and `exp_avg_sq` for each parameter without
    state) and, where torch's Adam keeps one per parameter, a zero `step`: what
    `Adam._init_group` would create at the first update, so the run (and a resume from the
    save) continues exactly as without it. An optimizer with any state is left alone."""
    for inner in _inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        init_state_fn = getattr(inner, "init_state_fn", None)
        if torch_optimizer is None or init_state_fn is None or any(
                torch_optimizer.state.values()):
            continue
        init_state_fn(torch_optimizer, inner.config)
        if not keeps_step_per_parameter(torch_optimizer):
            continue
        for group in torch_optimizer.param_groups:
            for param in group["params"]:
                state = torch_optimizer.state[param]
                if state and "step" not in state:
                    state["step"] = _adam_step(group, param, 0.0)


@_fix("create_state_if_missing", self_test=LOAD_PATH_SELF_TEST,
      works_around="DistributedOptimizer.state_dict's `assert len(steps) == 1` "
                   "(optimizer/distrib_optimizer.py:839), reached from sharded_state_dict at "
                   ":1532",
      why="a freshly built optimizer has no state to describe, so a load template cannot be "
          "built; Megatron's own dummy step (:1422-1437) creates it, the load replaces it")
def create_state_if_missing(optimizer) -> None:
    """A fresh distributed optimizer has no state to describe (`assert len(steps) == 1`,
    distrib_optimizer.py:839); Megatron's own dummy step creates it (replaced by the load)."""
    for inner in _inner_optimizers(optimizer):
        if _is_distributed(inner) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


@_fix("keep_step_out_of_param_state", self_test=LOAD_PATH_SELF_TEST, context=True,
      works_around="DistributedOptimizer._set_main_param_and_optimizer_states "
                   "(optimizer/distrib_optimizer.py:1193; read at :1223, copied at :1225)",
      why="it expects a `step` tensor the loaded dict lacks (KeyError, fully_reshardable) or "
          "overwrites the right step with the receiving optimizer's dummy one (dp_reshardable)")
@contextlib.contextmanager
def keep_step_out_of_param_state(optimizer) -> Iterator[None]:
    """The per-parameter copy (distrib_optimizer.py:1193) expects a `step` tensor the loaded
    dict lacks (KeyError), or, dp_reshardable, overwrites the right step with the receiving
    optimizer's dummy one. Handing it the parameter's own step makes that a no-op; the step
    itself comes from the param groups, as Megatron's load sets it."""
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


@_fix("load_without_grad", self_test=LOAD_PATH_SELF_TEST, context=True,
      works_around="DistributedOptimizer.load_parameter_state_from_dp_reshardable, which copies "
                   "into leaf parameters outside no_grad (optimizer/distrib_optimizer.py:2061, "
                   "copy at :1225)",
      why="with fp32 parameters the copy is an in-place operation on a leaf that requires "
          "grad, a RuntimeError")
def load_without_grad():
    """`torch.no_grad()` around the optimizer's `load_state_dict`."""
    return torch.no_grad()


@_fix("give_each_param_its_own_step", self_test=LOAD_PATH_SELF_TEST,
      works_around="DistributedOptimizer.load_state_dict, which gives every parameter one "
                   "shared `step` tensor (optimizer/distrib_optimizer.py:1028-1032)",
      why="silent: torch's foreach AdamW then increments the shared step once per parameter, "
          "so bias correction drifts from the uninterrupted run")
def give_each_param_its_own_step(optimizer) -> None:
    """The load gives every parameter one shared `step` tensor (distrib_optimizer.py:1028);
    torch's foreach Adam then increments it once per parameter: each gets its own copy."""
    for inner in _inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for state in torch_optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].detach().clone()


def _shard_is_empty(param) -> bool:
    return param.to_local().numel() == 0


def _adam_step(group: dict, param, value: float) -> torch.Tensor:
    """A `step` as torch's Adam keeps it (`Adam._init_group`): on the parameter's device when
    capturable or fused, else a CPU scalar."""
    device = param.device if group.get("capturable") or group.get("fused") else "cpu"
    return torch.tensor(value, dtype=torch.float32, device=device)


def _held_step(torch_optimizer) -> float:
    """The step of this rank's parameters with a shard here (every one the same: they update
    together), or -1 where this rank holds no shard with state."""
    for group in torch_optimizer.param_groups:
        for param in group["params"]:
            state = torch_optimizer.state.get(param)
            if state and "step" in state and not _shard_is_empty(param):
                return float(state["step"])
    return -1.0


def _steps_over_ranks(torch_optimizers: list) -> list[float]:
    """Each optimizer's step as the ranks holding a shard of it keep it (max over every rank;
    0 before any holds state). A bucket's rows split into equal, padded shards leave the last
    ranks none of it once DP nears its row count (tests/dist/test_fsdp_empty_rank.py: a rank
    without the expert bucket); a rank holds no shard at all, and so no step of its own, once
    DP passes the row count of every bucket, the embedding's included."""
    held = [_held_step(adam) for adam in torch_optimizers]
    first = torch_optimizers[0].param_groups[0]["params"][0]
    steps = torch.tensor(held, dtype=torch.float64, device=first.to_local().device)
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX)
    return [max(step, 0.0) for step in steps.tolist()]


@_fix("empty_shard_optimizer_state", self_test="tests/dist/test_fsdp.py",
      works_around="Megatron FSDP's update_main_grads, which gives a parameter whose shard on "
                   "this rank is empty no gradient (distributed/fsdp/src/megatron_fsdp/"
                   "param_and_grad_buffer.py:3393-3394), so Adam keeps no state for it there, "
                   "and DistributedOptimizer._init_optimizer_states_with_dummy_values, which "
                   "skips it too (optimizer/distrib_optimizer.py:1430-1434)",
      why="the fsdp_dtensor state dicts then differ between ranks (the uneven-DTensor metadata, "
          "megatron_fsdp/uneven_dtensor.py:51, :249-252, pairs different collectives: the save "
          "hangs), and DCP may keep an empty shard's stale `step`: a resume drifts")
def empty_shard_optimizer_state(optimizer) -> None:
    """Give every Megatron FSDP parameter whose shard on this rank is empty the (empty) Adam
    state the others have, so every rank describes the same tensors, and, at every save, the
    step the ranks holding a shard have: DCP keeps one rank's copy of each `step`, and one left
    from an earlier save would resume bias correction from the wrong step."""
    inners = [inner for inner in _inner_optimizers(optimizer)
              if getattr(getattr(inner, "ddp_config", None), "use_megatron_fsdp", False)]
    if not inners:
        return
    adams = [inner.optimizer for inner in inners]
    for adam, step in zip(adams, _steps_over_ranks(adams), strict=True):
        for group in adam.param_groups:
            for param in group["params"]:
                if not _shard_is_empty(param):
                    continue
                if not adam.state.get(param):
                    adam.state[param] = {"exp_avg": torch.zeros_like(param),
                                         "exp_avg_sq": torch.zeros_like(param)}
                adam.state[param]["step"] = _adam_step(group, param, step)


class _ParameterLookup:
    """A Megatron FSDP chunk as `handle_swiglu_in_state_dict` asks it for parameters: by the
    name given, else by that name under the chunk's `module.` (the optimizer's keys)."""

    def __init__(self, chunk) -> None:
        self.module = chunk  # `get_attr_wrapped_model` finds the config through it

    def named_modules(self, *args, **kwargs):
        return self.module.named_modules(*args, **kwargs)

    def get_parameter(self, name: str):
        try:
            return self.module.get_parameter(name)
        except AttributeError:
            return self.module.get_parameter(f"module.{name}")


@_fix("swiglu_optimizer_keys", self_test="tests/dist/test_fsdp.py", when_skipped=_unchanged,
      works_around="handle_swiglu_in_state_dict, which looks the optimizer state's parameters "
                   "up by their key less one `module.` (transformer/fsdp_dtensor_checkpoint.py:"
                   "375-377) on the chunk whose own parameters carry two (`module.module.`: the "
                   "adapter around MegatronFSDP around the model)",
      why="a SwiGLU model under Megatron FSDP fails to save or resume fsdp_dtensor once its "
          "optimizer has state (AttributeError: MegatronFSDP has no attribute `decoder`)")
def swiglu_optimizer_keys(chunk):
    """The chunk to hand `handle_swiglu_in_state_dict`: one that finds the optimizer state's
    parameters as well as the model state's."""
    return _ParameterLookup(chunk)


@_fix("adopt_hyperparameters", self_test=LOAD_PATH_SELF_TEST,
      works_around="DistributedOptimizer.load_state_dict matching saved param groups to its own "
                   "by max_lr/min_lr (optimizer/distrib_optimizer.py:941-970), and torch's "
                   "load_state_dict restoring the saved betas and eps",
      why="a resume with another learning rate fails with a KeyError, and one with other Adam "
          "settings silently keeps the saved ones; a resume applies this run's values")
def adopt_hyperparameters(loaded, values: dict) -> None:
    """Resume with this run's learning rates and Adam settings, not the saved ones.

    Megatron's param groups carry `max_lr`/`min_lr`, which the scheduler reads
    (optimizer_param_scheduler.py `get_lr`), and the distributed optimizer matches saved groups
    to its own by them (distrib_optimizer.py:941-970, a KeyError when the lr changed); torch's
    `load_state_dict` would restore the saved betas and eps. Every group of this project's
    optimizer uses the config's values (no per-group overrides), so they are written into each
    saved group of the loaded optimizer state before the load; a changed value is stated
    before launch."""
    _into_param_groups(loaded, values)


def _into_param_groups(loaded, values: dict) -> None:
    """Into every saved param group: the distributed optimizer's `param_groups`, and Megatron
    FSDP's fsdp_dtensor groups, saved per parameter as `param_to_group_meta`
    (optimizer/distrib_optimizer.py:1648-1652)."""
    if isinstance(loaded, dict):
        for key, value in loaded.items():
            if key == "param_groups" and isinstance(value, list):
                for group in value:
                    group.update({k: v for k, v in values.items() if k in group})
            elif key == "param_to_group_meta" and isinstance(value, dict):
                for group in value.values():
                    group.update({k: v for k, v in values.items() if k in group})
            else:
                _into_param_groups(value, values)
    elif isinstance(loaded, list):
        for value in loaded:
            _into_param_groups(value, values)


FIX_NAMES: tuple[str, ...] = tuple(FIXES)

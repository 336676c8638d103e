"""Every change this project makes to Megatron Core's behaviour on the checkpoint paths.

Megatron Core 0.19.2 is used unmodified; where its save or load does the wrong thing here (a
defect on the torch-Adam path the CPU takes, a slow default, a pickle that runs code, two log
lines around an error we report ourselves), a function or context manager below works around
it from the outside, around Megatron's own calls, citing the Megatron file:line it works
around (`docs/checkpoints.md` tells the longer stories). The rest of the package calls them
only through this module.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator

import torch

from plugins.protocol.errors import UserError

# --- Saving -------------------------------------------------------------------------------


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


# --- Asynchronous saves ---------------------------------------------------------------------


def forked_results_queue() -> None:
    """The writer hands its results over Megatron's process-wide queue, by default a
    multiprocessing Manager spawned inside the first save (strategies/filesystem_async.py:
    52-66), whose fresh interpreter imports torch (3-4 s of that save's step). Forked from
    this process instead, up front, it costs a fork."""
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


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


# --- Loading --------------------------------------------------------------------------------


class UntrustedCheckpointError(UserError):
    """A checkpoint object that the restricted unpickler refuses (one line for the user)."""


def _refused_global(error: Exception) -> str:
    """The global torch's unpickler refused, e.g. `GLOBAL builtins.open`."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ")[:120]
    return type(error).__name__


def _load_bytes_weights_only(planner, read_item, value) -> None:
    """`DefaultLoadPlanner.load_bytes` (torch/distributed/checkpoint/default_planner.py:381-392)
    with `weights_only=True`: a checkpoint's non-tensor objects (the RNG streams, Megatron's
    optimizer param groups) are unpickled by torch's restricted unpickler, which builds tensors,
    numbers, strings and containers and refuses anything else instead of running it."""
    from torch.distributed.checkpoint._traverse import set_element

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


def create_state_if_missing(optimizer) -> None:
    """A fresh distributed optimizer has no state to describe (`assert len(steps) == 1`,
    distrib_optimizer.py:839); Megatron's own dummy step creates it (replaced by the load)."""
    for inner in _inner_optimizers(optimizer):
        if _is_distributed(inner) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


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


def load_without_grad():
    """`torch.no_grad()` around the optimizer's `load_state_dict`."""
    return torch.no_grad()


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
    if isinstance(loaded, dict):
        for key, value in loaded.items():
            if key == "param_groups" and isinstance(value, list):
                for group in value:
                    group.update({k: v for k, v in values.items() if k in group})
            else:
                _into_param_groups(value, values)
    elif isinstance(loaded, list):
        for value in loaded:
            _into_param_groups(value, values)


"""Every workaround of Megatron Core on the checkpoint paths is needed: its check passes with all
of them and fails with that one left out (`megatron_fixes.skipping`).

Each check drives Megatron's own code the way a save or load does (the writer preparing its
buckets, its multithreaded write failing, the load planner unpickling an object, the save's
preprocessing of the common state, the collection at the end of the optimizer state) and
asserts what the fix changes. The checks change process-wide state (Megatron's results queue,
a process group, child processes), so each runs in a process of its own: one with every fix,
and one per fix with that fix left out. The fixes on the distributed optimizer's load path, and
the gather before a save, need a process group with a real model:
tests/dist/test_load_path_fixes.py; the disk probe needs a file system that fills up:
tests/dist/test_full_disk.py.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import pickle
import queue
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.forked import run_forked

# ---- the checks (run in a fresh interpreter each) ------------------------------------------


def _prepare_write_data(directory: str, tensors: dict) -> object:
    """Megatron's writer after `prepare_write_data` for a plan of `tensors` (the step's part of
    a save, dist_checkpointing/strategies/filesystem_async.py:114-203)."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync,
    )
    from torch.distributed.checkpoint.filesystem import _StoragePrefix
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

    class Planner:
        def resolve_data(self, item):
            return tensors[item.index.fqn]

    plan = SavePlan(items=[WriteItem(index=MetadataIndex(key), type=WriteItemType.TENSOR)
                           for key in tensors], storage_data=_StoragePrefix("__0_"))
    writer = FileSystemWriterAsync(directory, thread_count=1)
    writer.prepare_write_data(plan, Planner())
    return writer


def check_in_process_write_results() -> None:
    import torch

    from trainer.checkpoint import megatron_fixes

    before = set(multiprocessing.active_children())
    try:
        with tempfile.TemporaryDirectory() as directory, megatron_fixes.in_process_write_results():
            writer = _prepare_write_data(directory, {"w": torch.ones(4)})
        started = _new_children(before)
        assert isinstance(writer.results_queue, queue.Queue), type(writer.results_queue).__name__
        assert not started, f"the save started {len(started)} process(es)"
    finally:  # without the fix, Megatron's spawned queue manager: outlived the check before
        for child in _new_children(before):
            child.terminate()
            child.join()


def _new_children(before: set) -> list:
    return list(set(multiprocessing.active_children()) - before)


def check_forked_results_queue() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from trainer.checkpoint import megatron_fixes

    before = set(multiprocessing.active_children())
    previous = filesystem_async._results_queue
    try:
        megatron_fixes.forked_results_queue()  # what AsyncSaves does when a session starts
        filesystem_async.get_write_results_queue()  # what the first save's writer asks for
        started = [type(child._popen).__module__ for child in _new_children(before)]
        assert started == ["multiprocessing.popen_fork"], started
    finally:
        for child in _new_children(before):
            child.terminate()
            child.join()
        filesystem_async._results_queue = previous


def check_writer_errors_unlogged() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from trainer.checkpoint import megatron_fixes

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    writer_logger = logging.getLogger(filesystem_async.__name__)
    writer_logger.addHandler(handler)
    results: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory() as directory:
        bucket = (str(Path(directory) / "gone" / "__0_0.distcp"), "__0_", ([], []))
        try:
            with megatron_fixes.writer_errors_unlogged():
                filesystem_async.FileSystemWriterAsync.write_preloaded_data_multithread(
                    [], False, 0, [bucket], results)
        finally:
            writer_logger.removeHandler(handler)
    assert isinstance(results.get_nowait(), Exception)  # the failure still reaches the save
    logged = [record.getMessage()[:60] for record in records if record.levelno >= logging.ERROR]
    assert logged == [], logged


def check_gc_frozen() -> None:
    import gc
    import weakref

    from trainer.checkpoint import megatron_fixes

    class Node:
        pass

    gc.disable()  # no collection between making the cycle and the one under test
    try:
        node = Node()
        node.itself = node
        alive = weakref.ref(node)
        del node
        with megatron_fixes.gc_frozen():
            gc.collect()  # what Megatron runs at optimizer/distrib_optimizer.py:1569
            assert alive() is not None, "the collection scanned objects older than the call"
        gc.collect()
        assert alive() is None
    finally:
        gc.enable()


def _buffer_and_views():
    import torch

    buffer = torch.arange(12, dtype=torch.float32)
    return buffer, {"first": buffer[:4], "rest": buffer[4:]}


def check_views_uncopied() -> None:
    from trainer.checkpoint import megatron_fixes

    _, views = _buffer_and_views()
    with tempfile.TemporaryDirectory() as directory, megatron_fixes.views_uncopied(), \
            megatron_fixes.in_process_write_results():
        writer = _prepare_write_data(directory, views)
    handed = [tensor for _, _, (_, items) in writer.write_buckets for _, tensor in items]
    assert [tensor is views[key] for tensor, key in zip(handed, views, strict=True)] == [
        True, True], "the step copied the views"


def check_views_copied_in_writer() -> None:
    import torch
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    from trainer.checkpoint import megatron_fixes

    _, views = _buffer_and_views()
    written: list = []

    def write(rank, buckets, results_queue):
        written.extend(tensor for _, _, (_, items) in buckets for _, tensor in items)

    buckets = [("dir/__0_0.distcp", "__0_", ([], list(views.items())))]
    request = megatron_fixes.views_copied_in_writer(AsyncRequest(write, (0, buckets, None), []))
    request.async_fn(*request.async_fn_args)  # as the forked writer calls it
    assert [torch.equal(tensor, view) for tensor, view in zip(written, views.values(),
                                                              strict=True)] == [True, True]
    views_written = [megatron_fixes.is_storage_view(tensor) for tensor in written]
    assert views_written == [False, False], "the writer writes each view's whole buffer"


def check_metadata_without_process_group() -> None:
    import torch
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess

    from trainer.checkpoint import megatron_fixes

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(),
                                             rank=0, world_size=1)
    # The content metadata as the sharded state dicts leave it (transformer/utils.py:247).
    metadata = {"singleton_local_shards": False, "dp_cp_group": torch.distributed.group.WORLD}
    sharded = {"run_state": {"step": 3},
               "content_metadata": megatron_fixes.metadata_without_process_group(metadata)}
    _, common = save_preprocess(sharded, validate_access_integrity=False)  # a later async save
    try:
        pickle.dumps(common)  # what torch.save of the common state does
    except TypeError as error:
        raise AssertionError(f"the common state cannot be saved: {error}") from None
    assert common["content_metadata"] == {"singleton_local_shards": False}


class _Planted:
    """Unpickling this runs `open(path, "w")`: the code a tampered checkpoint would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def check_weights_only_objects() -> None:
    import torch
    from megatron.core.dist_checkpointing.strategies.torch import MCoreLoadPlanner
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    from trainer.checkpoint import megatron_fixes

    with tempfile.TemporaryDirectory() as directory:
        marker = Path(directory) / "ran"
        saved = io.BytesIO()
        torch.save({"planted": _Planted(str(marker))}, saved)
        saved.seek(0)
        planner = MCoreLoadPlanner(flatten_state_dict=False)
        planner.state_dict = {}
        item = ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex("rng_state"),
                        dest_offsets=torch.Size([0]), storage_index=MetadataIndex("rng_state"),
                        storage_offsets=torch.Size([0]), lengths=torch.Size([0]))
        refused = None
        with megatron_fixes.weights_only_objects():
            try:
                planner.load_bytes(item, saved)  # what torch DCP's reader calls per object
            except megatron_fixes.UntrustedCheckpointError as error:
                refused = str(error)
        assert not marker.exists(), "loading the checkpoint object ran its pickled code"
    assert refused is not None and "rng_state holds pickled code" in refused, refused


UNIT_CHECKS: dict[str, Callable[[], None]] = {
    "gc_frozen": check_gc_frozen,
    "in_process_write_results": check_in_process_write_results,
    "writer_errors_unlogged": check_writer_errors_unlogged,
    "forked_results_queue": check_forked_results_queue,
    "views_uncopied": check_views_uncopied,
    "views_copied_in_writer": check_views_copied_in_writer,
    "metadata_without_process_group": check_metadata_without_process_group,
    "weights_only_objects": check_weights_only_objects,
}
# Need a process group with the distributed optimizer (tests/dist/test_load_path_fixes.py) or a
# file system that fills up (tests/dist/test_full_disk.py).
DIST_CHECKED = {
    "params_gathered_before_save", "create_state_if_missing", "keep_step_out_of_param_state",
    "load_without_grad", "give_each_param_its_own_step", "adopt_hyperparameters",
    "disk_asked_after_a_failed_write", "empty_shard_optimizer_state", "swiglu_optimizer_keys",
}


def check_outcomes(checks: dict[str, Callable[[], None]], names: list[str]) -> dict[str, str]:
    """Name -> "ok", or the error its check raised: a subprocess reports every failure, and the
    test decides which were expected (tests/unit/test_cpu_runtime.py runs its checks so too)."""
    outcome: dict[str, str] = {}
    for name in names:
        try:
            checks[name]()
            outcome[name] = "ok"
        except Exception as error:  # report any failure; the test decides
            outcome[name] = f"{type(error).__name__}: {error}"
    return outcome


def run_checks_in_this_process(skip: list[str], names: list[str]) -> None:
    """Subprocess body: run the named checks with `skip` left out, print one JSON line."""
    from trainer.checkpoint import megatron_fixes

    with megatron_fixes.skipping(skip):
        outcome = check_outcomes(UNIT_CHECKS, names)
    print(json.dumps(outcome))


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, str]]:
    """'all' -> every check with every fix; fix name -> its check with that fix left out. Each
    in a process of its own, forked from one that imported torch once (tests/forked.py)."""
    runs = {"all": [[], list(UNIT_CHECKS)], **{name: [[name], [name]] for name in UNIT_CHECKS}}
    return run_forked("tests.unit.test_megatron_fixes:run_checks_in_this_process", runs)


@pytest.mark.parametrize("fix", list(UNIT_CHECKS))
def test_check_passes_with_every_fix(outcomes, fix):
    assert outcomes["all"][fix] == "ok"


@pytest.mark.parametrize("fix", list(UNIT_CHECKS))
def test_check_fails_without_its_fix(outcomes, fix):
    # The check ran to its own assertion: what the fix changes is what differs.
    assert outcomes[fix][fix].startswith("AssertionError: "), outcomes[fix][fix]


def test_every_fix_has_a_self_test():
    from trainer.checkpoint.megatron_fixes import FIX_NAMES, FIXES, UNIT_SELF_TEST

    assert set(FIX_NAMES) == set(UNIT_CHECKS) | DIST_CHECKED
    assert {name for name in FIX_NAMES if FIXES[name].patch.self_test == UNIT_SELF_TEST} == set(
        UNIT_CHECKS)


@pytest.mark.parametrize("name", sorted(set(UNIT_CHECKS) | DIST_CHECKED))
def test_every_fix_cites_what_it_works_around_and_why(name):
    from trainer.checkpoint.megatron_fixes import FIXES

    fix = FIXES[name]
    assert re.search(r"\.py:\d+", fix.patch.works_around), fix.patch.works_around  # file:line
    assert fix.patch.why and "\n" not in fix.patch.why
    assert callable(fix.apply)


def test_an_unknown_fix_name_is_refused():
    from trainer.checkpoint.megatron_fixes import skipping

    with pytest.raises(ValueError, match="unknown Megatron fixes"), skipping({"no_such_fix"}):
        pass

"""An asynchronous save leaves the copies of CPU views to its forked writer
(trainer/checkpoint/megatron_fixes.py, `views_uncopied` and `compact_buckets`): the step hands
the writer the parameters as they are, and the writer copies each view before writing, so that
a file holds the view's bytes and not its whole buffer. Without a process group."""

from __future__ import annotations

import torch
from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
from torch.distributed.checkpoint.filesystem import _StoragePrefix
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

from trainer.checkpoint.megatron_fixes import (
    compact_buckets,
    in_process_write_results,
    is_storage_view,
    views_uncopied,
)


def _buffer_and_views():
    buffer = torch.arange(12, dtype=torch.float32)
    return buffer, {"first": buffer[:4], "rest": buffer[4:]}


def test_a_slice_of_a_buffer_is_a_view_and_a_whole_tensor_is_not():
    buffer, views = _buffer_and_views()
    assert is_storage_view(views["first"])
    assert not is_storage_view(buffer)
    assert not is_storage_view(views["first"].clone())


def test_compact_buckets_copies_views_only():
    buffer, views = _buffer_and_views()
    whole = torch.ones(3)
    buckets = [("dir/f0", "f0", (["bytes item"], [("a", views["first"]), ("b", whole)]))]
    (path, name, (byte_items, tensors)), = compact_buckets(buckets)
    assert (path, name, byte_items) == ("dir/f0", "f0", ["bytes item"])
    (a, first), (b, kept) = tensors
    assert (a, b) == ("a", "b")
    assert torch.equal(first, views["first"]) and not is_storage_view(first)
    assert first.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    assert kept is whole


class _Planner:
    def __init__(self, tensors: dict):
        self.tensors = tensors

    def resolve_data(self, item: WriteItem):
        return self.tensors[item.index.fqn]


def _prepared(tmp_path, tensors: dict) -> list:
    plan = SavePlan(items=[WriteItem(index=MetadataIndex(key), type=WriteItemType.TENSOR)
                           for key in tensors], storage_data=_StoragePrefix("__0_"))
    writer = FileSystemWriterAsync(str(tmp_path), thread_count=1)
    with in_process_write_results():
        writer.prepare_write_data(plan, _Planner(tensors))
    return [tensor for _, _, (_, items) in writer.write_buckets for _, tensor in items]


def test_megatron_copies_views_in_the_step_and_views_uncopied_leaves_them(tmp_path):
    buffer, views = _buffer_and_views()
    shares_buffer = [t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
                     for t in _prepared(tmp_path, views)]
    assert shares_buffer == [False, False]  # Megatron's own copies, in the training process
    with views_uncopied():
        handed = _prepared(tmp_path, views)
    assert [t is views[key] for t, key in zip(handed, views, strict=True)] == [True, True]
    assert FileSystemWriterAsync.prepare_write_data.__name__ == "prepare_write_data"

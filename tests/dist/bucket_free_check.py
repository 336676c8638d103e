"""Does Megatron FSDP free a bucket that an unfinished collective still reads or writes?

Megatron FSDP frees a parameter or gradient bucket by resizing its storage to 0
(`param_and_grad_buffer._free_storage`), which returns the memory to the allocator whoever
still holds it. On CUDA the stream order keeps a gather's bucket alive; on gloo ranks nothing
does, and a gather still writing into a freed bucket would damage the heap. `BucketFreeCheck`
records each collective Megatron FSDP starts without waiting (`_coalescing_manager(...,
async_ops=True)`, the parameter all-gathers) with the storages it reads and writes, and at every
free, which of them has not finished and uses the freed storage.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field


def _span(tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


@dataclass
class _Started:
    works: list  # the coalesced collective's work objects
    spans: list[tuple[int, int]]  # (address, bytes) of every storage it reads or writes


@dataclass
class BucketFreeCheck:
    """Wraps `_coalescing_manager` and `_free_storage` of Megatron FSDP's buffer module while
    entered; `in_use(tensor)` says which unfinished collective uses its storage."""

    module: object  # megatron_fsdp.param_and_grad_buffer
    started: list[_Started] = field(default_factory=list)
    frees: int = 0
    frees_with_a_collective_unfinished: int = 0
    collectives: int = 0
    freed_in_use: list[str] = field(default_factory=list)

    def __enter__(self) -> BucketFreeCheck:
        self._originals = (self.module._coalescing_manager, self.module._free_storage)
        self.module._coalescing_manager = self._coalescing_manager
        self.module._free_storage = self._free_storage
        return self

    def __exit__(self, *exc) -> None:
        self.module._coalescing_manager, self.module._free_storage = self._originals

    def unfinished(self) -> list[_Started]:
        self.started = [s for s in self.started if not all(w.is_completed() for w in s.works)]
        return self.started

    def in_use(self, tensor) -> list[str]:
        """'address+bytes' of each unfinished collective's storage that overlaps `tensor`'s."""
        address, size = _span(tensor)
        return [f"{start:#x}+{length}" for started in self.unfinished()
                for start, length in started.spans
                if size and start < address + size and address < start + length]

    @contextlib.contextmanager
    def _coalescing_manager(self, group=None, device=None, async_ops=False):
        from torch.distributed import distributed_c10d as c10d

        with self._originals[0](group, device=device, async_ops=async_ops) as manager:
            # The list the collectives inside append to (`distributed_c10d._CollOp`).
            ops = c10d._world.pg_coalesce_state.get(group or c10d._get_default_group(), [])
            yield manager
            spans = [_span(t) for op in ops for t in (op.tensor, op.dst_tensor) if t is not None]
        if async_ops:
            self.collectives += 1
            self.started.append(_Started(list(manager.works), spans))

    def _free_storage(self, tensor) -> None:
        self.frees += 1
        self.frees_with_a_collective_unfinished += bool(self.unfinished())
        in_use = self.in_use(tensor)
        if in_use:
            where = "".join(traceback.format_stack(limit=6))
            self.freed_in_use.append(f"storage in use by {in_use}, freed at\n{where}")
        self._originals[1](tensor)

    def figures(self) -> dict:
        return {"frees": self.frees, "collectives": self.collectives,
                "frees_with_a_collective_unfinished": self.frees_with_a_collective_unfinished,
                "freed_in_use": self.freed_in_use}

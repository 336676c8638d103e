"""Reading one region (a layer, an expert) of a stored tensor from a torch_dist checkpoint.

Why not `dist_checkpointing.load`: on one process it cannot load part of a stacked tensor. Megatron
Core 0.19.2 describes the shards a template does not ask for as held by rank (rank + 1) %
world_size (`dist_checkpointing/strategies/torch.py:206-214`), which with one process is this very
rank, and torch then refuses the shard count ("Number of local shards (1) does not match ...").
Loading whole stacked tensors instead would hold every layer of a weight at once (Mixtral-8x7B's
expert fc1: 60 GB). torch's distributed-checkpoint reader, given a small load planner that asks
for exactly the wanted region, reads only the stored chunks that overlap it, whatever TP/PP/EP
layout wrote them: the streaming export's unit.

A step without `run.json` (Megatron-LM's, Megatron Bridge's, an early import) is read unchecked
(`export_step`), so a file of it cut short, overwritten or gone is first met here, by torch DCP:
what it raises for that (`DCP_DAMAGE`) becomes one line naming the step and the file
(`export_step.unreadable_line`); any other exception is a bug and stays a traceback.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from plugins.protocol.errors import ConfigError
from trainer.checkpoint.format import DCP_METADATA
from trainer.interop.export_step import unreadable_line

# What torch DCP (2.13) raises on a damaged or missing file: `FileSystemReader.read_metadata`
# unpickles `.metadata` (`FileNotFoundError`, `EOFError`, `pickle.UnpicklingError`; a
# `ValueError` for some garbage); `FileSystemReader.read_data` hands each `.distcp` slice to
# `torch.load` (`EOFError`, `UnpicklingError`, `RuntimeError` "PytorchStreamReader failed
# reading zip archive", `FileNotFoundError`), and `dcp.load` re-reads `.metadata`, raising
# `AssertionError("metadata is None; ...")` when it cannot. `dcp.load` wraps each in
# `CheckpointException` (a `BaseException`).
INDEX_DAMAGE = (OSError, EOFError, ValueError, pickle.UnpicklingError)
DCP_DAMAGE = (*INDEX_DAMAGE, RuntimeError)
METADATA_NONE = "metadata is None"  # the AssertionError dcp.load raises for an unread index


@dataclass(frozen=True)
class Region:
    """`sizes` elements of checkpoint tensor `key` starting at `offsets` (global coordinates)."""

    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class _RegionPlanner(LoadPlanner):
    """Reads each wanted region into its own tensor; nothing else of the checkpoint."""

    def __init__(self, regions: dict[str, Region], targets: dict[str, torch.Tensor]) -> None:
        self.regions, self.targets = regions, targets

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        items = []
        for name, region in self.regions.items():
            stored = self.metadata.state_dict_metadata[region.key]
            chunk = ChunkStorageMetadata(torch.Size(region.offsets), torch.Size(region.sizes))
            for item in create_read_items_for_chunk_list(region.key, stored, [chunk]):
                # The destination is named by our own name: several names may read one key.
                dest = MetadataIndex(name, item.dest_index.offset, 0)
                items.append(dataclasses.replace(item, dest_index=dest))
        return LoadPlan(items)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item, value) -> None:
        raise TypeError("a region read asks for tensors only")  # not DCP_DAMAGE: a bug

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self.targets[read_item.dest_index.fqn]
        return narrow_tensor_by_index(target, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item, tensor) -> None:
        pass  # resolve_tensor handed out a view of the target: the data is already in place


def damage_reason(error: BaseException) -> str:
    """How a file torch DCP failed on is damaged, in `unreadable_line`'s words."""
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return "cut short or damaged"


def _unread(error: BaseException) -> BaseException | None:
    """The damage under what `dcp.load` raised (`CheckpointException` wraps each rank's
    error), or None when it is not one a damaged file causes (a bug: re-raised)."""
    if isinstance(error, CheckpointException):
        error = next(iter(error.failures.values()))[0]
    if isinstance(error, AssertionError):
        return error if METADATA_NONE in str(error) else None
    return error if isinstance(error, DCP_DAMAGE) else None


def damaged_read(path: Path, error: BaseException) -> ConfigError | None:
    """The one line for a failed `dcp.load` of `path`: the file, from the error (a missing
    file's name, the index's), else its `.distcp` files (sizes were checked before the read,
    `export_step.checked_step`: what fails here was changed in place)."""
    cause = _unread(error)
    if cause is None:
        return None
    if isinstance(cause, AssertionError):
        return ConfigError(unreadable_line(path, DCP_METADATA))
    named = getattr(cause, "filename", None)
    file = Path(named).name if named else None
    return ConfigError(unreadable_line(path, file, damage_reason(cause)))


def stored_tensors(path: Path) -> dict[str, TensorStorageMetadata]:
    """Checkpoint key -> what is stored for it (global size, dtype, chunks); one line when
    DCP's index (`.metadata`) is missing or cannot be unpickled."""
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except INDEX_DAMAGE as error:
        raise ConfigError(unreadable_line(path, DCP_METADATA, damage_reason(error))) from None
    return {key: md for key, md in metadata.state_dict_metadata.items()
            if isinstance(md, TensorStorageMetadata)}


def read_regions(path: Path, regions: dict[str, Region],
                 stored: dict[str, TensorStorageMetadata]) -> dict[str, torch.Tensor]:
    """Each region as a tensor of its sizes, in the stored dtype."""
    for region in regions.values():
        if region.key not in stored:
            raise ConfigError(f"checkpoint {path} has no tensor {region.key}; it was not written "
                              "by a model of its config.yaml's shape")
    targets = {name: torch.empty(region.sizes, dtype=stored[region.key].properties.dtype)
               for name, region in regions.items()}
    try:
        dcp_load({}, storage_reader=FileSystemReader(str(path)),
                 planner=_RegionPlanner(regions, targets), no_dist=True)
    except (CheckpointException, AssertionError) as error:
        damaged = damaged_read(path, error)
        if damaged is None:
            raise
        raise damaged from None
    return targets

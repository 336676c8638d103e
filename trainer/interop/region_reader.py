"""Reading one region (a layer, an expert) of a stored tensor from a torch_dist checkpoint.

Why not `dist_checkpointing.load`: on one process it cannot load part of a stacked tensor. Megatron
Core 0.19.2 describes the shards a template does not ask for as held by rank (rank + 1) %
world_size (`dist_checkpointing/strategies/torch.py:206-214`), which with one process is this very
rank, and torch then refuses the shard count ("Number of local shards (1) does not match ...").
Loading whole stacked tensors instead would hold every layer of a weight at once (Mixtral-8x7B's
expert fc1: 60 GB). torch's distributed-checkpoint reader, given a small load planner that asks
for exactly the wanted region, reads only the stored chunks that overlap it, whatever TP/PP/EP
layout wrote them: the streaming export's unit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from plugins.protocol.errors import ConfigError


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
        raise RuntimeError("a region read asks for tensors only")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self.targets[read_item.dest_index.fqn]
        return narrow_tensor_by_index(target, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item, tensor) -> None:
        pass  # resolve_tensor handed out a view of the target: the data is already in place


def stored_tensors(path: Path) -> dict[str, TensorStorageMetadata]:
    """Checkpoint key -> what is stored for it (global size, dtype, chunks)."""
    metadata = FileSystemReader(str(path)).read_metadata()
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
    dcp_load({}, storage_reader=FileSystemReader(str(path)),
             planner=_RegionPlanner(regions, targets), no_dist=True)
    return targets

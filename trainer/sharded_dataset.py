"""A prepared source cut into shards, read by Megatron Core as the one dataset it was cut from.

`scripts/prepare_data.py num_shards=N` cuts a source's documents, in order, into N indexed
datasets. Given to Megatron's builder one by one they would be a blend: one GPTDataset per shard,
each with its own document, sample and shuffle index, mixed by weight, which draws other samples
than the unsharded dataset does. `ShardedIndexedDataset` is a read-only view of the shards end to
end, which is the unsharded dataset's sequence list, and `ShardedGPTDataset` builds that view for
a manifest's split (`recipes/config/blend.py` `manifest_dataset`), so GPTDataset's indices, and
so its samples in their order, are the unsharded dataset's.

The view holds what Megatron Core (megatron/core/datasets/ of the installed package) reads of a
low-level dataset:
- `sequence_lengths`, int32: the element count a split is cut from (gpt_dataset.py:165, called by
  blended_megatron_dataset_builder.py:458), the tokens of an epoch (gpt_dataset.py:674) and the
  sample index (gpt_dataset.py:571-584, which asserts the int32);
- `get(idx, offset, length)`: the tokens of every sample (gpt_dataset.py:394, 417);
- `path_prefix`: where the index cache goes when no `path_to_cache` is set (gpt_dataset.py:473);
- `__len__`, `__getitem__`, `document_indices` and `sequence_modes`, as `IndexedDataset` has them
  (indexed_dataset.py:768-904), for any other reader.
The lengths of all shards are held in memory (4 bytes a sequence), as GPTDataset itself copies
them to build its sample index (gpt_dataset.py:580).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from megatron.core.datasets.gpt_dataset import GPTDataset

from recipes.config.blend import manifest_prefixes, manifest_split


class ShardedIndexedDataset:
    """Indexed datasets end to end: sequence i of the view is sequence i - start(k) of shard k."""

    def __init__(self, path_prefix: str, shards: Sequence) -> None:
        if not shards:
            raise ValueError(f"{path_prefix}: a sharded dataset needs at least one shard")
        self.path_prefix = path_prefix
        self.shards = list(shards)
        counts = [len(shard) for shard in self.shards]
        # starts[k]: the view's index of shard k's first sequence; starts[-1]: all sequences.
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._lengths = np.concatenate(
            [shard.sequence_lengths for shard in self.shards]).astype(np.int32, copy=False)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, idx: int) -> tuple[int, int]:
        """(shard, its sequence) of the view's sequence `idx` (negative: from the end)."""
        total = len(self)
        position = int(idx) + total if idx < 0 else int(idx)
        if not 0 <= position < total:
            raise IndexError(f"sequence {idx} of a dataset of {total} sequences")
        shard = int(np.searchsorted(self.starts, position, side="right")) - 1
        return shard, position - int(self.starts[shard])

    def get(self, idx: int, offset: int = 0, length: int | None = None):
        """Tokens [offset, offset + length) of sequence `idx`, as `IndexedDataset.get`."""
        shard, local = self.locate(idx)
        return self.shards[shard].get(local, offset=offset, length=length)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self._slice(idx)
        shard, local = self.locate(idx)
        return self.shards[shard][local]

    def _slice(self, idx: slice):
        """Sequences of a contiguous slice, gathered from the shards it crosses."""
        start, stop, step = idx.indices(len(self))
        if step != 1:
            raise ValueError("Slices into indexed_dataset must be contiguous")
        sequences, modes = [], []
        for shard, first in zip(self.shards, self.starts[:-1], strict=True):
            low, high = max(start - int(first), 0), min(stop - int(first), len(shard))
            if low >= high:
                continue
            piece = shard[low:high]
            if isinstance(piece, tuple):  # multimodal: (sequences, modes)
                sequences += piece[0]
                modes.append(piece[1])
            else:
                sequences += piece
        return (sequences, np.concatenate(modes)) if modes else sequences

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self._lengths

    @property
    def document_indices(self) -> np.ndarray:
        """Each document's first sequence in the view, and the sequence count last."""
        tails = [np.asarray(shard.document_indices[1:], dtype=np.int64) + first
                 for shard, first in zip(self.shards, self.starts[:-1], strict=True)]
        return np.concatenate([np.zeros(1, dtype=np.int64), *tails])

    @property
    def sequence_modes(self) -> np.ndarray:
        return np.concatenate([shard.sequence_modes for shard in self.shards])


class ShardedGPTDataset(GPTDataset):
    """Megatron's GPTDataset, whose low-level dataset may be a manifest's split: the view over
    its shards. Megatron's builder calls `build_low_level_dataset` with each path of the blend
    (blended_megatron_dataset_builder.py:455); GPTDataset's own `numel_low_level_dataset`
    (`sequence_lengths.shape[0]`, gpt_dataset.py:165) counts the view's sequences as it is."""

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config):
        found = manifest_split(dataset_path)
        if found is None:
            return GPTDataset.build_low_level_dataset(dataset_path, config)
        manifest, split = found
        shards = [GPTDataset.build_low_level_dataset(prefix, config)
                  for prefix in manifest_prefixes(manifest, split)]
        return ShardedIndexedDataset(str(Path(manifest).with_suffix("")), shards)

"""The order of a packed blend's rows: which source, and which of its packs, each row takes.

Megatron's blended dataset gives each sample to the source furthest below its share, in
compiled code (`megatron.core.datasets.helpers_cpp.build_blending_indices`); packed rows follow
that rule over an epoch of as many rows as the sources have packs, so a source weighed above its
share of the packs repeats its packs and one below leaves some out. A source of weight 0 is
never taken.

An epoch at Nemotron scale is ~10^9 rows (15 T tokens in 8k rows): as a Python list that was
an hour and ~200 GB on every rank. The order is two arrays (int16 source, int64 pack: 10 bytes a
row) written once per run by rank 0 into `<run_dir>/data_index/` and memory-mapped by every rank
(pages are read as steps ask for them), as Megatron's `BlendedDataset` caches its
`dataset_index` / `dataset_sample_index`. The files are named by what decides the order (rule,
pack counts, weights), so another blend or another index gets its own.

`data.pack_order=v1` is the order this project used before: the same rule weighing row r as
r + 1 where Megatron weighs it max(r, 1), in Python; runs saved under it resume in it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep.npy_file import npy_problem

CHUNK = 1 << 24  # rows turned from Megatron's running counts into pack numbers at a time


def megatron_order(counts: Sequence[int], weights: Sequence[float],
                   out: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(source, pack of that source) of every row of an epoch of sum(counts) rows, by Megatron's
    `build_blending_indices` over the sources of weight > 0, written into `out` (two arrays of
    sum(counts) int16 / int64, e.g. memory-mapped files) when given."""
    from megatron.core.datasets import helpers_cpp

    counts = np.asarray(counts, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    total = int(counts.sum())
    sources, packs = out if out is not None else (np.empty(total, np.int16),
                                                  np.empty(total, np.int64))
    # Megatron's ties would go to a weight-0 source at 0 error; a source without packs has none.
    kept = np.flatnonzero((weights > 0) & (counts > 0))
    share = weights[kept] / weights[kept].sum()
    helpers_cpp.build_blending_indices(sources, packs, share, len(kept), total, False)
    for lo in range(0, total, CHUNK):  # kept positions -> source ids; counts -> packs
        chosen = kept[sources[lo : lo + CHUNK]]
        sources[lo : lo + CHUNK] = chosen
        packs[lo : lo + CHUNK] %= counts[chosen]
    return sources, packs


def v1_order(counts: Sequence[int], weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The order of `data.pack_order=v1`: each row r to the source with the largest
    share x (r + 1) - taken (ties to the first), in Python (for the runs saved under it)."""
    total, share = sum(counts), [w / sum(weights) for w in weights]
    taken = [0] * len(counts)
    sources, packs = np.empty(total, np.int16), np.empty(total, np.int64)
    for row in range(total):
        source = max(range(len(counts)), key=lambda i: (
            share[i] * (row + 1) - taken[i] if counts[i] else -math.inf))
        sources[row], packs[row] = source, taken[source] % counts[source]
        taken[source] += 1
    return sources, packs


def order_paths(folder: Path, rule: str, counts: Sequence[int],
                weights: Sequence[float]) -> tuple[Path, Path]:
    """The two files holding the order of (rule, counts, weights) in `folder`."""
    key = json.dumps([rule, [int(c) for c in counts], [float(w) for w in weights]])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return folder / f"pack_order-{digest}-sources.npy", folder / f"pack_order-{digest}-packs.npy"


def order_file_whole(path: Path, rows: int, dtype: type) -> bool:
    """Whether a cached order file is a whole `.npy` of `rows` values of `dtype`."""
    if not path.is_file() or npy_problem(path):
        return False
    array = np.load(path, mmap_mode="r")
    return array.dtype == dtype and array.shape == (rows,)


def write_order(paths: tuple[Path, Path], rule: str, counts: Sequence[int],
                weights: Sequence[float]) -> None:
    """Write the order of (rule, counts, weights) to `paths`, each beside its name first and
    then renamed, so a reader never maps a half-written file."""
    total = int(sum(counts))
    partial = [path.with_name(f".{path.name}.partial") for path in paths]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    if rule == "v1":
        for array, path in zip(v1_order(counts, weights), partial, strict=True):
            with open(path, "wb") as f:  # np.save would add `.npy` to the name
                np.save(f, array)
    else:
        out = (np.lib.format.open_memmap(partial[0], "w+", np.int16, (total,)),
               np.lib.format.open_memmap(partial[1], "w+", np.int64, (total,)))
        megatron_order(counts, weights, out)
        for array in out:
            array.flush()
        del out
    for path, final in zip(partial, paths, strict=True):
        os.replace(path, final)


def cached_order(folder: Path, rule: str, counts: Sequence[int], weights: Sequence[float],
                 build: bool) -> tuple[np.ndarray, np.ndarray]:
    """The order, memory-mapped from `folder`; with `build` (one rank, before the others read)
    it is written first when its files are missing or not whole (a cache: it follows from its
    name's inputs, so a damaged one is written again, not refused)."""
    paths = order_paths(folder, rule, counts, weights)
    total = int(sum(counts))
    expected = list(zip(paths, (np.int16, np.int64), strict=True))
    if build and not all(order_file_whole(path, total, dtype) for path, dtype in expected):
        write_order(paths, rule, counts, weights)
    return np.load(paths[0], mmap_mode="r"), np.load(paths[1], mmap_mode="r")

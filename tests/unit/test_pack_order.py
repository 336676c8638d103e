"""The order of a packed blend's rows (`trainer/pack_order.py`): Megatron's blending rule over
the sources' packs, the earlier `v1` rule kept for the runs saved under it, and the cache every
rank maps instead of holding a list of every pack."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.pack_order import (
    cached_order,
    megatron_order,
    order_paths,
    v1_order,
)


def _rule_by_hand(counts, weights, first_row_weight):
    """Each row r to the source of weight > 0 with the largest share x w(r) - taken (ties to
    the first), its pack number taken modulo its packs: w(r) = max(r, 1) is Megatron's
    `build_blending_indices`, r + 1 the v1 rule."""
    share = [w / sum(weights) for w in weights]
    taken, rows = [0] * len(counts), []
    for row in range(sum(counts)):
        x = first_row_weight(row)
        source = max((i for i in range(len(counts)) if weights[i] > 0),
                     key=lambda i: share[i] * x - taken[i])
        rows.append((source, taken[source] % counts[source]))
        taken[source] += 1
    return rows


def _pairs(order) -> list[tuple[int, int]]:
    return list(zip(order[0].tolist(), order[1].tolist(), strict=True))


@pytest.mark.parametrize("counts, weights", [
    ([5], [1.0]), ([2, 8], [1.0, 1.0]), ([10, 10], [3.0, 1.0]), ([7, 3, 11], [0.2, 0.5, 0.3]),
    ([4, 9, 6], [1.0, 0.0, 2.0]),
])
def test_megatron_order_is_megatrons_rule_over_the_packs(counts, weights):
    order = megatron_order(counts, weights)
    assert order[0].dtype == np.int16 and order[1].dtype == np.int64
    assert _pairs(order) == _rule_by_hand(counts, weights, lambda row: max(row, 1))


def test_the_two_rules_differ_and_v1_is_the_earlier_one():
    """v1 weighs row r as r + 1: alternating equal weights it agrees, with 3 : 1 it does not."""
    counts, weights = [10, 10], [3.0, 1.0]
    assert _pairs(v1_order(counts, weights)) == _rule_by_hand(counts, weights, lambda r: r + 1)
    assert _pairs(v1_order(counts, weights)) != _pairs(megatron_order(counts, weights))
    assert [s for s, _ in _pairs(v1_order([2, 8], [1.0, 1.0]))] == [0, 1] * 5


def test_a_source_weighed_above_its_packs_repeats_them_one_below_leaves_some_out():
    sources, packs = megatron_order([2, 8], [1.0, 1.0])
    assert packs[sources == 0].tolist() == [0, 1, 0, 1, 0]  # repeated
    assert packs[sources == 1].tolist() == [0, 1, 2, 3, 4]  # 5, 6, 7 left out
    heavy = megatron_order([10, 10], [3.0, 1.0])[0]
    assert (heavy == 0).sum() == 15 and (heavy == 1).sum() == 5
    assert _pairs(megatron_order([5], [1.0])) == [(0, i) for i in range(5)]


def test_a_source_of_weight_zero_is_never_taken():
    """Megatron's rule alone would give it the ties at zero error (row 1 of [0, 1])."""
    sources, _ = megatron_order([3, 3], [0.0, 1.0])
    assert sources.tolist() == [1] * 6


def test_the_order_is_cached_once_and_mapped(tmp_path):
    counts, weights = [3, 5, 4], [0.5, 0.25, 0.25]
    sources, packs = cached_order(tmp_path, "megatron", counts, weights, build=True)
    assert isinstance(sources, np.memmap) and isinstance(packs, np.memmap)
    assert _pairs((sources, packs)) == _pairs(megatron_order(counts, weights))
    paths = order_paths(tmp_path, "megatron", counts, weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    stamp = [p.stat().st_mtime_ns for p in paths]
    cached_order(tmp_path, "megatron", counts, weights, build=True)
    assert [p.stat().st_mtime_ns for p in paths] == stamp  # whole: not written again
    assert cached_order(tmp_path, "megatron", counts, weights, build=False)[1].tolist() == \
        packs.tolist()


def test_each_rule_count_and_weight_has_its_own_files(tmp_path):
    base = order_paths(tmp_path, "megatron", [3, 5], [1.0, 1.0])
    assert base != order_paths(tmp_path, "v1", [3, 5], [1.0, 1.0])
    assert base != order_paths(tmp_path, "megatron", [3, 6], [1.0, 1.0])
    assert base != order_paths(tmp_path, "megatron", [3, 5], [1.0, 2.0])
    v1 = cached_order(tmp_path, "v1", [10, 10], [3.0, 1.0], build=True)
    assert _pairs(v1) == _pairs(v1_order([10, 10], [3.0, 1.0]))


@pytest.mark.parametrize("damage", ["cut", "other_rows", "garbled_header"])
def test_a_damaged_cache_file_is_written_again(tmp_path, damage):
    counts, weights = [30, 50], [1.0, 1.0]
    cached_order(tmp_path, "megatron", counts, weights, build=True)
    path = order_paths(tmp_path, "megatron", counts, weights)[1]
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:-8])
    elif damage == "other_rows":
        np.save(path, np.arange(79, dtype=np.int64))
    else:
        path.write_bytes(b"garbage" + path.read_bytes()[7:])
    order = cached_order(tmp_path, "megatron", counts, weights, build=True)
    assert _pairs(order) == _pairs(megatron_order(counts, weights))
    assert not list(tmp_path.glob(".*partial"))


def test_a_sources_packs_are_numbered_across_its_shards():
    """Pack p of a source of three datasets is found by bisection of their first numbers."""
    from trainer.data import SourcePacks

    class _Index:
        def __init__(self, packs):
            self.packs = packs

        def __len__(self):
            return self.packs

    shards = [("a", _Index(3)), ("b", _Index(1)), ("c", _Index(4))]
    table = SourcePacks.of(shards)
    assert len(table) == 8
    found = [(name, number) for name, _, number in map(table.locate, range(8))]
    assert found == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0), ("c", 1), ("c", 2),
                     ("c", 3)]

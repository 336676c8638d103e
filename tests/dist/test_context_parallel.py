"""Context parallel splits each sequence with Megatron Core's load-balanced chunks.

The domain example: a sequence of 8,192 tokens at CP=2 is cut into 4 chunks of 2,048; rank 0
keeps positions 0-2,047 and 6,144-8,191, rank 1 keeps 2,048-6,143. Under causal attention that
gives both ranks the same number of attended (query, key) pairs, where a contiguous split gives
the second rank three times the first's. Packed rows are cut the same way per document. That CP
layouts train the same model as one rank is shown with the other layouts
(tests/dist/test_layout_equivalence.py: CP2, CP4, CP2 x TP2 + SP, CP2 x PP2 with the
distributed optimizer).
"""

from __future__ import annotations

import pytest

from plugins.protocol.cp_split import (
    balanced_positions,
    causal_pairs,
    contiguous_positions,
    document_positions,
)

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.cp_checks:split_positions"
LENGTH = 8192


def _ranges(positions: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive positions as inclusive (first, last) pairs."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], p)
        else:
            runs.append((p, p))
    return runs


@pytest.fixture(scope="module")
def cp2_split(launch_ranks):
    return launch_ranks(2, ENTRY, {"cp": 2, "length": LENGTH})


def test_megatron_split_matches_the_domain_example(cp2_split):
    by_rank = {r["cp_rank"]: r["positions"] for r in cp2_split}
    assert _ranges(by_rank[0]) == [(0, 2047), (6144, 8191)]
    assert _ranges(by_rank[1]) == [(2048, 6143)]
    assert by_rank[0] == balanced_positions(LENGTH, 2, 0)
    assert by_rank[1] == balanced_positions(LENGTH, 2, 1)


def test_balanced_split_balances_causal_work_and_contiguous_does_not(cp2_split):
    balanced = [causal_pairs(r["positions"]) for r in cp2_split]
    contiguous = [causal_pairs(contiguous_positions(LENGTH, 2, rank)) for rank in range(2)]
    assert sum(balanced) == sum(contiguous) == LENGTH * (LENGTH + 1) // 2
    assert balanced[0] == balanced[1]
    assert contiguous[1] / contiguous[0] == pytest.approx(3.0, rel=1e-3)
    for cp in (4, 8):  # at larger CP the balanced split stays exact; contiguous gets worse
        work = [causal_pairs(balanced_positions(LENGTH, cp, r)) for r in range(cp)]
        naive = [causal_pairs(contiguous_positions(LENGTH, cp, r)) for r in range(cp)]
        assert max(work) == min(work)
        assert max(naive) / min(naive) > 2 * cp - 2


def test_packed_rows_are_split_per_document(launch_ranks):
    bounds = [0, 8, 24, 32]  # three documents, each a multiple of 2 x CP = 4 tokens
    results = launch_ranks(2, ENTRY, {"cp": 2, "length": 32, "bounds": bounds})
    by_rank = {r["cp_rank"]: r["positions"] for r in results}
    assert by_rank[0] == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 24, 25, 30, 31]
    assert by_rank[1] == document_positions(bounds, 2, 1)
    assert sorted(by_rank[0] + by_rank[1]) == list(range(32))


def test_packed_split_needs_the_thd_partition_patch_on_cpu(launch_ranks):
    results = launch_ranks(2, ENTRY, {
        "cp": 2, "length": 32, "bounds": [0, 8, 24, 32], "skip": ["thd_cp_partition"],
    })
    # Without TE, Megatron's `tex` is None; with TE installed, its split is a CUDA kernel.
    assert all("'NoneType' object has no attribute 'thd_get_partitioned_indices'"
               in r.get("error", "") or "NVIDIA driver" in r.get("error", "")
               for r in results), results

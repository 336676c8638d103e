"""Which token positions a context-parallel rank holds, and how much causal work that is.

Torch-free arithmetic of Megatron Core's load-balanced split (`core/utils.py:2456-2513`,
`_get_batch_on_this_cp_rank_per_sequence_balancing`): a sequence is cut into 2 x CP equal chunks
and rank r keeps chunks r and 2·CP−1−r. Under causal attention a token at position p attends to
p+1 positions, so late chunks cost more than early ones; pairing an early chunk with its mirror
image gives every rank the same number of attended (query, key) pairs. The contiguous split
(rank r keeps the r-th 1/CP of the sequence) leaves the last rank the most work.

Packed rows are split the same way per document (`core/utils.py:2406-2453`): each document,
padded to a multiple of 2 x CP, is cut into 2 x CP chunks and rank r keeps chunks r and
2·CP−1−r of every document.
"""

from __future__ import annotations


def chunk_bounds(length: int, cp: int) -> list[tuple[int, int]]:
    """[start, end) of the 2 x CP equal chunks of a sequence of `length` tokens."""
    if cp < 1 or length % (2 * cp):
        raise ValueError(f"a length of {length} does not split into 2 x CP = {2 * cp} chunks")
    size = length // (2 * cp)
    return [(i * size, (i + 1) * size) for i in range(2 * cp)]


def balanced_positions(length: int, cp: int, rank: int) -> list[int]:
    """Positions rank `rank` holds under Megatron's load-balanced split, in its local order."""
    bounds = chunk_bounds(length, cp)
    first, second = bounds[rank], bounds[2 * cp - 1 - rank]
    return [*range(*first), *range(*second)]


def contiguous_positions(length: int, cp: int, rank: int) -> list[int]:
    """Positions of the naive split: rank r holds the r-th contiguous 1/CP of the sequence."""
    size = length // cp
    return list(range(rank * size, (rank + 1) * size))


def document_positions(bounds: list[int], cp: int, rank: int) -> list[int]:
    """Row positions rank `rank` holds of a packed row whose (padded) documents start and end
    at `bounds` (0, ..., row length): the load-balanced split applied to each document."""
    positions: list[int] = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=False):
        positions.extend(start + p for p in balanced_positions(end - start, cp, rank))
    return positions


def causal_pairs(positions: list[int]) -> int:
    """(query, key) pairs causal attention computes for these query positions: p + 1 each."""
    return sum(p + 1 for p in positions)

"""How a model's parameters split over ranks, the one type every family's parameter terms return.

Memory is bytes per parameter times parameters, so the counts are exact, not 12·L·h²: weights
split over TP, weights every TP rank holds a full copy of (norms, row-parallel biases, the MoE
router, learned positions) and expert weights (split over EP and expert-TP) are kept apart,
since they shard differently over data parallel and the dry run counts a replicated weight once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParamCount:
    """Parameters on one rank, by how they are split."""

    tp_split: int = 0  # split over TP: each TP rank holds its own slice
    replicated: int = 0  # a full copy on every TP rank (norms, row-parallel biases, router)
    expert: int = 0  # expert weights: split over EP and expert-TP, sharded over expert-DP
    tied_copy: int = 0  # the last stage's copy of a tied input embedding (inside tp_split)

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(self.tp_split + other.tp_split, self.replicated + other.replicated,
                          self.expert + other.expert, self.tied_copy + other.tied_copy)

    def scale(self, n: int) -> ParamCount:
        return ParamCount(self.tp_split * n, self.replicated * n, self.expert * n,
                          self.tied_copy * n)

    @property
    def dense(self) -> int:
        return self.tp_split + self.replicated

    @property
    def total(self) -> int:
        """Every parameter tensor element this rank allocates."""
        return self.dense + self.expert

    def distinct(self, tp_rank: int) -> int:
        """What this rank adds to the whole model, each weight once (the dry run's count)."""
        replicated = self.replicated if tp_rank == 0 else 0
        return self.tp_split - self.tied_copy + replicated + self.expert

"""Context parallel without a process group: the chunk arithmetic, the CPU reference attention's
mask, and each of the plugin's rules firing alone."""

from __future__ import annotations

import pytest
import torch

from plugins.context_parallel.config import (
    check_cp_a2a_heads,
    check_cp_hierarchical_sizes,
)
from plugins.protocol.cp_split import (
    balanced_positions,
    chunk_bounds,
    document_positions,
)
from recipes.registry import get_recipe


def test_every_position_is_held_by_exactly_one_cp_rank():
    for cp in (1, 2, 4, 8):
        held = sorted(p for rank in range(cp) for p in balanced_positions(64, cp, rank))
        assert held == list(range(64))
    with pytest.raises(ValueError, match="does not split into 2 x CP = 8 chunks"):
        chunk_bounds(60, 4)


def test_documents_are_split_one_by_one():
    bounds = [0, 4, 12]
    assert document_positions(bounds, 2, 0) == [0, 3, 4, 5, 10, 11]
    assert document_positions(bounds, 2, 1) == [1, 2, 6, 7, 8, 9]


@pytest.mark.parametrize("bounds", [None, [0, 8, 24, 32]], ids=["row", "packed"])
@pytest.mark.parametrize("cp", [2, 4])
def test_cp_mask_rows_are_the_single_rank_mask_rows(cp, bounds):
    """Each CP rank's mask, with keys put back in row order, is that rank's rows of the
    one-rank (document-)causal mask: CP attention computes exactly what one rank would."""
    from trainer.cpu_runtime.cp_attention import cp_causal_mask, cp_positions
    from trainer.cpu_runtime.packed_attention import document_causal_mask

    length = 32
    full = document_causal_mask(torch.tensor(bounds or [0, length]), length)[0, 0]
    positions = cp_positions(length, cp, bounds)
    keys = torch.tensor([p for rank in positions for p in rank])
    for rank in range(cp):
        mask = cp_causal_mask(positions, rank, bounds)[0, 0]
        in_row_order = torch.empty_like(mask)
        in_row_order[:, keys] = mask
        assert torch.equal(in_row_order, full[positions[rank]])


def _cfg(recipe: str, **plugin):
    cfg = get_recipe(recipe)
    for key, value in plugin.items():
        setattr(cfg.plugins.context_parallel, key, value)
    return cfg


def test_rule_a2a_p2p_needs_hierarchical_sizes_alone():
    assert check_cp_hierarchical_sizes(_cfg("tiny_cp4")) is None
    assert check_cp_hierarchical_sizes(_cfg("tiny_cp4", comm_type="a2a+p2p",
                                             hierarchical_sizes=[2, 2])) is None
    message = check_cp_hierarchical_sizes(_cfg("tiny_cp4", comm_type="a2a+p2p",
                                               hierarchical_sizes=[2, 4]))
    assert "whose product is parallel.context=4, got [2, 4]" in message
    stray = check_cp_hierarchical_sizes(_cfg("tiny_cp2", hierarchical_sizes=[2, 1]))
    assert "only used with comm_type=a2a+p2p" in stray


def test_rule_a2a_needs_heads_divisible_by_cp_alone():
    cfg = _cfg("tiny_cp4", comm_type="a2a")
    assert check_cp_a2a_heads(cfg) is None  # 4 heads over 4 CP ranks
    cfg.model.num_attention_heads = 2
    assert "does not divide by it" in check_cp_a2a_heads(cfg)
    cfg.plugins.context_parallel.comm_type = "p2p"
    assert check_cp_a2a_heads(cfg) is None

"""Full recompute with `train.recompute_num_layers` that does not divide a stage's layers:
Megatron Core's uniform method cuts the last block short, so a chunk keeps ceil(layers / block)
block inputs (`megatron/core/recompute.py`: `min(layer_idx + recompute_num_layers, ...)`), not
layers / block of them."""

from __future__ import annotations

import pytest

from recipes.plan.activations import checkpoint_bytes, recompute_inputs_kept, stage_activations
from recipes.resolve import resolve_config


@pytest.mark.parametrize(("chunks", "block", "kept"), [
    ([8], 1, 8), ([8], 3, 3), ([8], 8, 1), ([8], 100, 1), ([4, 4], 3, 4), ([2, 3], 2, 3),
])
def test_each_chunk_keeps_its_blocks_rounded_up(chunks, block, kept) -> None:
    assert recompute_inputs_kept(chunks, block) == kept


@pytest.mark.parametrize(("block", "kept"), [(1, 8), (3, 3), (8, 1), (100, 1)])
def test_an_8_layer_stage_is_priced_at_the_inputs_megatron_keeps(block, kept) -> None:
    cfg = resolve_config(["recipe=llama3_8b_tp8_pp4_dp2", "train.recompute=full",
                          f"train.recompute_num_layers={block}"])
    stage = stage_activations(cfg, "flash", te_layers=True)[0]
    assert stage.layers == 8
    assert stage.layers_total == pytest.approx(kept * checkpoint_bytes(cfg) * stage.in_flight)

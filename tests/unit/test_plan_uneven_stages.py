"""Uneven pipeline stages (Llama 3.1 405B: 7 + 14 x 8 + 7 = 126 layers): the layout object's
split, the validation rule's one-line refusals, and the three published layouts.

That Megatron Core builds the same split from `parallel.first_stage_layers` /
`last_stage_layers` is checked on the real model in `test_plan_params.py`.
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from recipes.resolve import resolve_config

LLAMA31 = ("llama31_405b_tp8_pp16_dp64", "llama31_405b_tp8_pp16_dp128",
           "llama31_405b_128k_tp8_cp16_pp16_dp8")


def test_first_and_last_stage_hold_one_layer_fewer():
    layout = get_recipe("llama31_405b_tp8_pp16_dp128").layout
    assert layout.stage_layers() == [7] + [8] * 14 + [7]
    assert sum(layout.stage_layers()) == 126


@pytest.mark.parametrize(("name", "world", "degrees", "seq", "tokens"), [
    (LLAMA31[0], 8192, (8, 16, 1, 64), 8192, 16_777_216),
    (LLAMA31[1], 16384, (8, 16, 1, 128), 8192, 16_777_216),
    (LLAMA31[2], 16384, (8, 16, 16, 8), 131_072, 16_777_216),
])
def test_the_published_layouts(name, world, degrees, seq, tokens):
    cfg = resolve_config([f"recipe={name}"])
    layout = cfg.layout
    assert layout.world_size == world
    assert (layout.tensor, layout.pipeline, layout.context, layout.data_parallel) == degrees
    assert cfg.model.seq_length == seq
    assert layout.global_batch * seq == tokens


def test_even_split_is_unchanged():
    assert get_recipe("llama3_8b_tp8_pp4_dp2").layout.stage_layers() == [8, 8, 8, 8]
    assert get_recipe("tiny_dp1").layout.stage_layers() == [4]


@pytest.mark.parametrize(("overrides", "message"), [
    (["parallel.first_stage_layers=5"],
     "leaves 121 layers for 15 middle stages"),
    (["parallel.first_stage_layers=0"], "parallel.first_stage_layers=0 needs"),
    (["parallel.first_stage_layers=200"], "leaves -74 layers"),
])
def test_bad_uneven_splits_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        resolve_config([f"recipe={LLAMA31[1]}", "parallel.last_stage_layers=null", *overrides])
    assert "\n" not in str(error.value)


def test_uneven_needs_pipelining():
    with pytest.raises(ConfigError, match="needs parallel.pipeline >= 2"):
        resolve_config(["recipe=tiny_dp1", "parallel.first_stage_layers=2"])

"""A NemotronH release that is not the recipe is refused in one line whose overrides, applied
once, make the recipe that release: the pattern is given whole, its MTP depths included."""

from __future__ import annotations

import re

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from recipes.resolve import resolve_config
from trainer.interop import hf_config


def refusal(hf: dict, recipe: str, overrides: list[str] | None = None) -> tuple[str, list[str]]:
    """The one-line refusal of `recipe` (with `overrides`) for `hf`, and the overrides it names."""
    cfg = resolve_config([f"recipe={recipe}", *(overrides or [])])
    with pytest.raises(ConfigError) as caught:
        hf_config.compare_with_recipe(hf, cfg.model, recipe)
    line = str(caught.value)
    assert "\n" not in line
    return line, line.split(" or override ", 1)[1].split(" ")


def follow(hf: dict, recipe: str, overrides: list[str]) -> None:
    """The recipe with the named overrides resolves, checked as `convert.py import` checks it,
    and is the release (compare_with_recipe passes)."""
    cfg = resolve_config([f"recipe={recipe}", *overrides])
    hf_config.compare_with_recipe(hf, cfg.model, recipe)


@pytest.fixture(scope="module")
def super_tiny() -> dict:
    """A tiny Super-shaped release (latent MoE, one stored MTP depth) as our export writes it."""
    return hf_config.hf_config_for(get_recipe("super_tiny_dp1").model, "float32")


def test_a_recipe_without_mtp_is_told_the_whole_pattern_at_once(super_tiny) -> None:
    line, fixes = refusal(super_tiny, "hybrid_tiny_dp1")
    assert "model.hybrid_layer_pattern=MEM*EME/*E" in fixes
    assert "num_nextn_predict_layers=1 of layers '*E'" in line  # the MTP difference is named
    assert "layers_block_type=MEM*EME but" in line and "moe_latent_size=32 but" in line
    follow(super_tiny, "hybrid_tiny_dp1", fixes)


def test_a_main_pattern_fix_keeps_the_recipes_matching_mtp_depths(super_tiny) -> None:
    """The recipe's MTP already matches (one stored depth it runs twice): the fix keeps both."""
    other = {**super_tiny, "layers_block_type": ["linear_attention", "moe"] * 3 + ["moe"]}
    _, fixes = refusal(other, "super_tiny_dp1")
    assert fixes == ["model.hybrid_layer_pattern=MEMEMEE/*E/*E"]
    follow(other, "super_tiny_dp1", fixes)


@pytest.mark.parametrize("stored, fixes", [
    (2, ["model.mtp_use_repeated_layer=false"]),
    (0, ["model.hybrid_layer_pattern=MEM*EME", "model.mtp_loss_scaling_factor=0.1",
         "model.mtp_use_repeated_layer=false"]),
])
def test_a_shared_depth_is_unshared_unless_the_release_stores_one(super_tiny, stored,
                                                                  fixes) -> None:
    """The recipe shares one depth over two; a release storing two, or none, needs it off."""
    other = {**super_tiny, "num_nextn_predict_layers": stored}
    line, named = refusal(other, "super_tiny_dp1")
    assert f"num_nextn_predict_layers={stored} of layers" in line
    assert re.search(r"stores 1 MTP depth\(s\) of '\*E' \(2 run\)", line)
    assert named == fixes
    follow(other, "super_tiny_dp1", named)

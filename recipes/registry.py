"""The one explicit list of recipes: name -> function. Nothing registers itself on import."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from recipes import library
from recipes.errors import ConfigError
from recipes.schema import RunConfig

RECIPES: dict[str, Callable[[], RunConfig]] = {
    # Tiny CPU layouts: the default, and one per layout the equivalence tests compare.
    "tiny_tp2_pp2": library.tiny_tp2_pp2,
    "tiny_dp1": library.tiny_dp1,
    "tiny_dp1_recompute": library.tiny_dp1_recompute,
    "tiny_dp2": library.tiny_dp2,
    "tiny_dp2_distopt": library.tiny_dp2_distopt,
    "tiny_tp2": library.tiny_tp2,
    "tiny_tp2_sp": library.tiny_tp2_sp,
    "tiny_pp2": library.tiny_pp2,
    "tiny_pp2_vpp2": library.tiny_pp2_vpp2,
    "tiny_tp2_sp_dp2_distopt": library.tiny_tp2_sp_dp2_distopt,
    "tiny_pp2_dp2_overlap": library.tiny_pp2_dp2_overlap,
    # 64 GPUs (8 nodes x 8).
    "llama3_8b_tp8_dp8": library.llama3_8b_tp8_dp8,
    "llama3_8b_tp8_pp4_dp2": library.llama3_8b_tp8_pp4_dp2,
    "llama3_8b_128k_tp8_cp8": library.llama3_8b_128k_tp8_cp8,
    "llama3_70b_tp4_pp4_cp2_vpp5_dp2": library.llama3_70b_tp4_pp4_cp2_vpp5_dp2,
    "nemotron4_15b_tp8_pp2_dp4": library.nemotron4_15b_tp8_pp2_dp4,
    "mixtral_8x7b_tp1_pp4_ep8_dp16": library.mixtral_8x7b_tp1_pp4_ep8_dp16,
}

# Short names for the domain text's two 64-GPU layouts (config A and config B).
ALIASES: dict[str, str] = {
    "8b_tp8_dp8": "llama3_8b_tp8_dp8",
    "8b_tp8_pp4_dp2": "llama3_8b_tp8_pp4_dp2",
}

DEFAULT_RECIPE = "tiny_tp2_pp2"


def recipe_names() -> list[str]:
    """Every name `recipe=` accepts: registered names first, then aliases."""
    return [*RECIPES, *ALIASES]


def canonical_name(name: str) -> str:
    """The registered name for `name` (resolving aliases); unknown names are a ConfigError."""
    if name in RECIPES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    near = difflib.get_close_matches(name, recipe_names(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(near)}?" if near else "recipe=list shows them all"
    raise ConfigError(f"unknown recipe '{name}'; {hint}")


def get_recipe(name: str) -> RunConfig:
    """A fresh configuration of recipe `name` (or an alias), its `name` field set."""
    canonical = canonical_name(name)
    cfg = RECIPES[canonical]()
    cfg.name = canonical
    return cfg


def recipe_description(name: str) -> str:
    """First line of the recipe function's docstring."""
    doc = RECIPES[canonical_name(name)].__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def format_recipe_list() -> str:
    """What `recipe=list` / `--help` prints: usage, then one line per recipe."""
    aliases_of: dict[str, list[str]] = {}
    for alias, target in ALIASES.items():
        aliases_of.setdefault(target, []).append(alias)
    labels = {
        name: name + (f" (alias {', '.join(aliases_of[name])})" if name in aliases_of else "")
        for name in RECIPES
    }
    width = max(len(label) for label in labels.values())
    lines = [
        "usage: python scripts/pretrain.py [recipe=NAME | config=RUN_DIR/config.yaml] "
        "[section.key=value ...] [dry_run=true]",
        f"recipes (default {DEFAULT_RECIPE}):",
    ]
    for name, label in labels.items():
        lines.append(f"  {label:<{width}}  {recipe_description(name)}")
    return "\n".join(lines)

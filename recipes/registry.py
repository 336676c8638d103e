"""The one explicit list of recipes: name -> function. Nothing registers itself on import."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from plugins.protocol.errors import ConfigError
from recipes import hf_tiny, llama3, llama31, mixtral, tiny
from recipes.config.schema import RunConfig
from recipes.nemotron import nemotron3_super, nemotron4, nemotron_h


def _by_name(*families: tuple[Callable[[], RunConfig], ...]) -> dict[str, Callable[[], RunConfig]]:
    """Registry keys are the recipe functions' own names, in catalogue order."""
    return {function.__name__: function for family in families for function in family}


# One explicit list: each family file ends with the tuple of its recipes (nothing registers
# itself on import). The tiny layouts come first; their first entry is the default recipe.
RECIPES: dict[str, Callable[[], RunConfig]] = _by_name(
    tiny.RECIPES, llama3.RECIPES, llama31.RECIPES, nemotron4.RECIPES, mixtral.RECIPES,
    nemotron_h.RECIPES, hf_tiny.RECIPES,
    nemotron3_super.RECIPES,
)

# Short names for reference configurations A and B (docs/reference-configurations.md).
ALIASES: dict[str, str] = {
    "8b_tp8_dp8": "llama3_8b_tp8_dp8",
    "8b_tp8_pp4_dp2": "llama3_8b_tp8_pp4_dp2",
}

DEFAULT_RECIPE = tiny.RECIPES[0].__name__


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
    """First paragraph of the recipe function's docstring, on one line (its first line alone
    would cut a sentence that wraps)."""
    doc = (RECIPES[canonical_name(name)].__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def format_recipe_list(default: str | None = None) -> str:
    """The recipe part of `recipe=list` / `--help`: one line per recipe, the default named
    (`default`: a command's own, where it runs another than the project's)."""
    aliases_of: dict[str, list[str]] = {}
    for alias, target in ALIASES.items():
        aliases_of.setdefault(target, []).append(alias)
    labels = {
        name: name + (f" (alias {', '.join(aliases_of[name])})" if name in aliases_of else "")
        for name in RECIPES
    }
    width = max(len(label) for label in labels.values())
    lines = [f"recipes (default {default or DEFAULT_RECIPE}):"]
    for name, label in labels.items():
        lines.append(f"  {label:<{width}}  {recipe_description(name)}")
    return "\n".join(lines)

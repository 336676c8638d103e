"""Turn command-line arguments into a validated `RunConfig`.

Arguments are `recipe=NAME` or `config=FILE` (a saved resolved config), then OmegaConf dotlist
overrides `a.b=c` applied in order. `recipe=list` asks for the recipe list (every script's
`--help` is answered by the entry contract before anything is resolved).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from plugins.protocol.errors import ConfigError
from recipes.config.io import load_config
from recipes.config.overrides import apply_overrides, split_override
from recipes.config.schema import RunConfig
from recipes.config.validation import Rule, validate
from recipes.registry import DEFAULT_RECIPE, get_recipe


class ListRecipesRequested(Exception):
    """The user asked for the recipe list; print `format_recipe_list()` and exit 0."""


@dataclass(kw_only=True)
class ParsedArgs:
    """The command line split into where the configuration starts and what changes it."""

    recipe: str | None = None  # recipe=NAME
    config: str | None = None  # config=FILE
    overrides: list[str] = field(default_factory=list)  # a.b=c, in order


def parse_args(argv: Sequence[str]) -> ParsedArgs:
    """Split argv; raises ListRecipesRequested for help and ConfigError for malformed ones."""
    parsed = ParsedArgs()
    for arg in argv:
        key, value = split_override(arg)
        if key == "recipe" and value == "list":
            raise ListRecipesRequested
        if key in ("recipe", "config"):
            if not value.strip():
                example = "recipe=tiny_dp1 (recipe=list shows all)" if key == "recipe" else (
                    "config=runs/<run>/config.yaml"
                )
                raise ConfigError(f"{key}= is empty; give it a value, e.g. {example}")
            if getattr(parsed, key) is not None:
                raise ConfigError(f"{key}= given twice ({getattr(parsed, key)}, {value}); keep one")
            setattr(parsed, key, value)
        else:
            parsed.overrides.append(arg)
    if parsed.recipe is not None and parsed.config is not None:
        raise ConfigError(
            f"give either recipe={parsed.recipe} or config={parsed.config}, not both; "
            "a saved config already names its recipe"
        )
    return parsed


def resolve_config(argv: Sequence[str], *, rules: Sequence[Rule] = ()) -> RunConfig:
    """Build, override and validate the configuration the command line describes.

    Raises `ListRecipesRequested` for `recipe=list`, and `ConfigError` (one line, with the fix)
    for a mistake, `ConfigErrors` for several (every bad override, else every broken rule).
    `rules` are checked after the core and plugin rules (the trainer's own,
    `trainer.throughput.RUN_RULES`). Reads no files beyond the config itself: the paths the
    config names (output, checkpoint, blend files) and `checkpoint.resume` are the trainer's
    `validate_paths` (trainer/checkpoint/preflight.py), run after data a blend says how to
    prepare is made. Does not check the machine; see `recipes.config.machine`.
    """
    cfg = build_config(argv)
    validate(cfg, rules, every=True)  # every broken rule, one line each
    return cfg


def build_config(argv: Sequence[str]) -> RunConfig:
    """The recipe or saved config with its overrides applied (typed), not yet validated: the
    layout search starts here, since the recipe's own layout need not divide another world
    size, and validates every layout it lists."""
    parsed = parse_args(argv)
    if parsed.config is not None:
        base = load_config(parsed.config)
    else:
        base = get_recipe(parsed.recipe or DEFAULT_RECIPE)
    return apply_overrides(base, parsed.overrides)

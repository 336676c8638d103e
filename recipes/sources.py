"""Where each setting of a recipe that reproduces a published run comes from, beside its value.

A user picks a `nemotron*` recipe to train as NVIDIA trained that model, so each setting must be
the published one, or say that nothing was published and whose value it takes, or say why it
differs. Such a recipe is written as a table of settings, each a value with its source:

    "optimizer.lr": published(1e-3, NANO3_CARD, "Bridge's demo recipe: 1.6e-3"),

and `sourced_recipe` turns the function returning that table into a registry recipe (a
`RunConfig` built from the schema's defaults and the table) that keeps the table, so
`tests/unit/test_nemotron_sources.py` can hold every setting the recipe makes to a source and
`recipes/nemotron/page.py` can write `docs/nemotron.md` from the recipes themselves. Shared
settings (a family's optimizer, the 64-GPU run's infrastructure) are tables of their own, merged
with `|`.

Kinds of source:

    published    the published pretraining run: a technical report, model card, NVIDIA's docs or
                 NVIDIA's own configs; `secondary` when read only through a summary of it
    unpublished  nothing published: the value of NVIDIA's framework recipe (Megatron Bridge's;
                 Nemotron-4 has none there: Bridge's common pretraining settings or NeMo's
                 Nemotron-4 template, each named, the other noted where they differ) or the
                 Megatron Core default it relies on
    differs      this recipe knowingly differs from the published run; `note` says why
    ours         nothing published and no framework value: this project's own choice, and why
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from recipes.config.schema import PhaseConfig, RunConfig

Kind = Literal["published", "unpublished", "differs", "ours"]
KINDS: tuple[str, ...] = ("published", "unpublished", "differs", "ours")


@dataclass(frozen=True)
class Source:
    kind: Kind
    where: str  # owner/repo@commit:path:line, or a report/model card and its section
    note: str = ""  # the other published value, or why this recipe differs
    secondary: bool = False  # read through a summary of the source, not the source itself


@dataclass(frozen=True)
class Setting:
    value: Any
    source: Source


Settings = dict[str, Setting]  # dotted field ('optimizer.lr', 'plugins.fp8.recipe', 'phases[1]')


def published(value: Any, where: str, note: str = "", secondary: bool = False) -> Setting:
    return Setting(value, Source("published", where, note, secondary))


def unpublished(value: Any, where: str, note: str = "") -> Setting:
    return Setting(value, Source("unpublished", where, note))


def differs(value: Any, where: str, why: str) -> Setting:
    return Setting(value, Source("differs", where, why))


def ours(value: Any, why: str) -> Setting:
    return Setting(value, Source("ours", "this project", why))


PHASE_KEY = re.compile(r"^phases\[(\d+)\]$")


def _set(cfg: RunConfig, dotted: str, value: Any) -> None:
    *sections, name = dotted.split(".")
    target = cfg
    for section in sections:
        target = getattr(target, section)
    if not hasattr(target, name):
        raise KeyError(f"{dotted} is not a config field")
    setattr(target, name, value)


def build(settings: Settings) -> RunConfig:
    """The run config of `settings`: the schema's defaults, each setting applied; phases from
    the `phases[i]` settings, in order."""
    cfg = RunConfig()
    phases: dict[int, PhaseConfig] = {}
    for key, setting in settings.items():
        if match := PHASE_KEY.match(key):
            phases[int(match.group(1))] = setting.value
        else:
            _set(cfg, key, setting.value)
    cfg.phases = [phases[i] for i in sorted(phases)]
    return cfg


def sourced_recipe(table: Callable[[], Settings]) -> Callable[[], RunConfig]:
    """A registry recipe from the function returning its settings table (its name and docstring
    are the recipe's); `recipe.settings()` gives the table back."""

    @functools.wraps(table)
    def recipe() -> RunConfig:
        return build(table())

    recipe.settings = table  # type: ignore[attr-defined]
    return recipe


def settings_of(recipe: Callable[[], RunConfig]) -> Settings | None:
    """The settings table of a sourced recipe, None for any other recipe."""
    table = getattr(recipe, "settings", None)
    return table() if table is not None else None


def steps_for_tokens(tokens: float, global_batch: int, seq_length: int) -> int:
    """Optimizer steps that train `tokens` at `global_batch` sequences of `seq_length` (the
    nearest whole step): the one conversion from a published token count to iterations."""
    return round(tokens / (global_batch * seq_length))


# --- what a recipe sets ---------------------------------------------------------------------

def _fields(value: Any, prefix: str) -> dict[str, Any]:
    found = {}
    for f in dataclasses.fields(value):
        inner = getattr(value, f.name)
        if dataclasses.is_dataclass(inner) and not isinstance(inner, PhaseConfig):
            found.update(_fields(inner, f"{prefix}{f.name}."))
        elif f.name != "phases":
            found[f"{prefix}{f.name}"] = inner
    return found


def config_values(cfg: RunConfig) -> dict[str, Any]:
    """Every field of `cfg` by dotted key, plugins included, phases as `phases[i]`."""
    values = _fields(cfg, "")
    values.update({f"phases[{i}]": phase for i, phase in enumerate(cfg.phases)})
    return values


def changed_fields(cfg: RunConfig) -> dict[str, Any]:
    """The fields where `cfg` differs from the schema's defaults (the recipe's name aside)."""
    default = config_values(RunConfig())
    return {key: value for key, value in config_values(cfg).items()
            if key != "name" and (key not in default or value != default[key])}


# The training settings a published run is made of: each needs a source even where it equals
# the schema's default (shape, batch, sequence, schedule, run length, optimizer, init,
# precision), plus the ones that exist only with the feature (`required_settings`).
TRAINING_SETTINGS = (
    "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.num_query_groups", "model.kv_channels", "model.seq_length", "model.vocab_size",
    "model.activation", "model.normalization", "model.position_embedding",
    "model.add_bias_linear", "model.share_embeddings_and_output_weights",
    "model.hidden_dropout", "model.attention_dropout", "model.init_method_std",
    "train.global_batch_size", "train.micro_batch_size", "train.train_iters",
    "optimizer.lr", "optimizer.min_lr", "optimizer.weight_decay", "optimizer.adam_beta1",
    "optimizer.adam_beta2", "optimizer.adam_eps", "optimizer.clip_grad",
    "scheduler.style", "scheduler.warmup_iters", "precision.dtype", "plugins.fp8.format",
)
MOE_SETTINGS = (
    "model.num_moe_experts", "model.moe_router_topk", "model.moe_ffn_hidden_size",
    "model.moe_shared_expert_ffn_hidden_size", "model.moe_router_score_function",
    "model.moe_router_expert_bias", "model.moe_router_bias_update_rate",
    "model.moe_router_topk_scaling_factor", "model.moe_router_fp32", "model.moe_load_balancing",
    "model.moe_aux_loss_coeff",
)
HYBRID_SETTINGS = (
    "model.hybrid_layer_pattern", "model.mamba_state_dim", "model.mamba_head_dim",
    "model.mamba_num_heads", "model.mamba_num_groups", "model.mamba_conv_kernel",
    "model.mamba_chunk_size",
)
ROPE_SETTINGS = ("model.rotary_base", "model.rotary_percent")
FP8_SETTINGS = ("plugins.fp8.recipe", "plugins.fp8.first_layers_bf16",
                "plugins.fp8.last_layers_bf16", "plugins.fp8.param_gather")
WSD_SETTINGS = ("scheduler.wsd_decay_style",)


def required_settings(cfg: RunConfig) -> tuple[str, ...]:
    """The settings `cfg` must source: the training settings, those of the features it has,
    and every field it changes from the schema's defaults."""
    needed = list(TRAINING_SETTINGS)
    m = cfg.model
    needed += MOE_SETTINGS if m.num_moe_experts else ()
    needed += HYBRID_SETTINGS if m.is_hybrid else ()
    needed += ROPE_SETTINGS if m.position_embedding == "rope" else ()
    needed += FP8_SETTINGS if cfg.plugins.fp8.format is not None else ()
    needed += WSD_SETTINGS if cfg.scheduler.style == "wsd" else ()
    if cfg.scheduler.style == "wsd" and not any(p.lr_decay for p in cfg.phases):
        needed += ("scheduler.wsd_decay_iters",)
    return tuple(dict.fromkeys([*needed, *changed_fields(cfg)]))


def unsourced(recipe: Callable[[], RunConfig]) -> list[str]:
    """The settings of a recipe without a source, or whose source table holds another value
    than the recipe trains with (empty: every setting sourced)."""
    table = settings_of(recipe) or {}
    cfg = recipe()
    values = config_values(cfg)
    missing = [key for key in required_settings(cfg) if key not in table]
    drifted = [key for key, setting in table.items() if values.get(key) != setting.value]
    return missing + [f"{key} (the table says {table[key].value!r}, the recipe trains "
                      f"{values.get(key)!r})" for key in drifted]

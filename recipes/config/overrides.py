"""Apply `a.b=c` overrides to a recipe with OmegaConf's dotlist grammar, with one-line errors.

OmegaConf parses and type-checks the values against the dataclass schema; this module only
turns its exceptions into sentences that name the key, what it expects and what to type instead.
The shape of each key is checked before OmegaConf sees it (a section that does not exist, a key a
section lacks, a value used as a section, an empty value), because OmegaConf would either accept
those silently (`checkpoint.load=` becomes null) or report them in its own words.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from plugins.protocol.errors import ConfigError, config_error
from plugins.registry import PluginsConfig
from recipes.config.arguments import as_written, describe_type, split_argument
from recipes.config.schema import PhaseConfig, RunConfig
from recipes.config.yaml_file import unreadable_value

# Short names people type from habit; suggestions only, never accepted as keys.
_HABITUAL_NAMES = {
    "tp": "parallel.tensor",
    "pp": "parallel.pipeline",
    "cp": "parallel.context",
    "ep": "parallel.expert",
    "etp": "parallel.expert_tensor",
    "vpp": "parallel.virtual_pipeline",
    "sp": "parallel.sequence_parallel",
    "mbs": "train.micro_batch_size",
    "gbs": "train.global_batch_size",
    "world_size": "cluster.nodes",
}
# Section names people type from habit (or from other frameworks): suggestions only.
_HABITUAL_SECTIONS = {
    "ckpt": "checkpoint",
    "checkpointing": "checkpoint",
    "opt": "optimizer",
    "optim": "optimizer",
    "sched": "scheduler",
    "lr_scheduler": "scheduler",
    "parallelism": "parallel",
    "distributed": "parallel",
    "training": "train",
    "trainer": "train",
    "log": "logging",
    "cpu_runtime": "cluster",
}
@dataclass(frozen=True)
class Retired:
    """A key that was removed or moved: what became of it and what to set instead (`<key> was
    <instead>`, the one line an override that still sets it gets), and what a config.yaml an
    earlier version saved carries over (its value -> the keys that now hold it; {} for a switch
    the config now implies)."""

    instead: str
    carries: Callable[[Any], dict[str, Any]] = lambda value: {}


_CPU_DEVICES = {"on": "cpu", True: "cpu", "off": "gpu", False: "gpu"}
# The core's retired keys, one entry each (a plugin's own are its config's `retired_keys`). A
# switch the config already implies is removed, not kept in step by hand; a key that moved
# keeps its value in a saved config.
RETIRED_KEYS = {
    "plugins.cpu_runtime.enabled": Retired(
        "moved: where ranks compute is cluster.device (auto, gpu or cpu; on was cpu, off was "
        "gpu); set cluster.device instead",
        lambda value: {"cluster.device": _CPU_DEVICES.get(value, "auto")}),
    "plugins.cpu_runtime.threads_per_rank": Retired(
        "moved to cluster.threads_per_rank; set that instead",
        lambda value: {"cluster.threads_per_rank": value}),
    "logging.metrics_file": Retired(
        "removed: every run writes metrics.jsonl, which its stop line, a resume's loss curve "
        "and compare_runs read; drop it"),
}
# Examples of list values whose current value and default are both empty (core fields only:
# a plugin's list is shown from its element type). Each is one the rules accept on a recipe.
_LIST_EXAMPLES = {
    "phases": "[{name: general, tokens: 0.8}, {name: quality, tokens: 0.2}]",
    "train.rampup_batch_size": "[32,32,1000]",
    "train.offload_modules": "[core_attn]",
    "train.cuda_graph_modules": "[attn]",
}
_ELEMENT_EXAMPLES = {int: "[2,2]", float: "[0.5,0.5]", str: "[a,b]", bool: "[true,false]"}
_LISTED_KEYS = 12  # an unknown key in a section this small lists the section's keys
_DATA_PARALLEL_NAMES = ("dp", "data_parallel", "data_parallel_size", "parallel.data")


@cache
def class_field_types(cls: type) -> Mapping[str, Any]:
    """A config dataclass's field types, resolved once per class: `typing.get_type_hints`
    evaluates every annotation anew (700 calls per config loaded, most of its time)."""
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


@cache
def config_keys() -> tuple[str, ...]:
    """Every settable leaf key of `RunConfig`, dotted (`model.hidden_size`, ...)."""

    def walk(cls: type, prefix: str) -> list[str]:
        keys = []
        for name, tp in class_field_types(cls).items():
            if dataclasses.is_dataclass(tp):
                keys.extend(walk(tp, f"{prefix}{name}."))
            else:
                keys.append(f"{prefix}{name}")
        return keys

    return tuple(walk(RunConfig, ""))


@cache
def config_sections() -> tuple[str, ...]:
    """Every section that holds settable keys, dotted, in schema order (`plugins.fp8`, ...)."""
    return tuple(dict.fromkeys(k.rpartition(".")[0] for k in config_keys() if "." in k))


def is_section(key: str) -> bool:
    """Whether `key` names a section (`model`, `plugins`, `plugins.fp8`), not a value."""
    return dataclasses.is_dataclass(field_type(key))


def field_type(key: str) -> Any | None:
    """The annotated type of a dotted key (a dataclass for a section), or None if unknown."""
    tp: Any = RunConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp):
            return None
        tp = class_field_types(tp).get(part)
        if tp is None:
            return None
    return tp


def closest_keys(key: str, limit: int = 3) -> list[str]:
    """Valid keys nearest to a mistyped one: habits, then the key's own section, then the same
    field name in other sections, then spelling anywhere."""
    keys = config_keys()
    section, _, leaf = key.rpartition(".")
    leaves = sorted({k.rsplit(".", 1)[-1] for k in keys})
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == section]
    ranked: list[str] = []
    if leaf in _HABITUAL_NAMES:
        ranked.append(_HABITUAL_NAMES[leaf])
    near_siblings = [s for s in siblings if len(leaf) > 2 and s.startswith(leaf)]
    near_siblings += difflib.get_close_matches(leaf, siblings, n=limit, cutoff=0.7)
    ranked += [f"{section}.{near}" if section else near for near in near_siblings]
    ranked += [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    for named in _sections_named(leaf):  # `precision.fp8` -> the keys of plugins.fp8
        ranked += [k for k in keys if k.startswith(named + ".")]
    ranked += difflib.get_close_matches(key, keys, n=limit, cutoff=0.6)
    for near_leaf in difflib.get_close_matches(leaf, leaves, n=limit, cutoff=0.7):
        ranked += [k for k in keys if k.rsplit(".", 1)[-1] == near_leaf]
    return list(dict.fromkeys(ranked))[:limit]


def _sections_named(name: str) -> list[str]:
    """Sections whose last part (or habitual name) is `name`: 'fp8' -> ['plugins.fp8']."""
    named = [s for s in config_sections() if s.rpartition(".")[2] == name]
    return named or ([_HABITUAL_SECTIONS[name]] if name in _HABITUAL_SECTIONS else [])


def missing_section(key: str) -> str | None:
    """The first dotted prefix of `key` used as a section that is no section, else None.

    `modle.hidden_size` -> 'modle'; `plugins.fp9.format` -> 'plugins.fp9'; `model.x` -> None.
    """
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if not is_section(prefix):
            return None if field_type(prefix) is not None else prefix
    return None


def nearest_sections(name: str, limit: int = 3) -> list[str]:
    """Existing sections nearest to a section name that does not exist: habits, sections that
    start with it (`plugins.fp` -> `plugins.fp8`), then spelling."""
    sections = list(dict.fromkeys(p for s in config_sections() for p in _prefixes(s)))
    ranked = [_HABITUAL_SECTIONS[name]] if name in _HABITUAL_SECTIONS else []
    ranked += [s for s in sections if s.rsplit(".", 1)[-1] == name]  # `fp8` -> `plugins.fp8`
    ranked += [s for s in sections if s.startswith(name)]
    ranked += difflib.get_close_matches(name, sections, n=limit, cutoff=0.6)
    ancestors = _prefixes(name)  # `plugins` exists when `plugins.fp9` does not: not a suggestion
    return [s for s in dict.fromkeys(ranked) if s not in ancestors][:limit]


def _prefixes(section: str) -> list[str]:
    """`plugins.fp8` -> ['plugins', 'plugins.fp8']."""
    parts = section.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def missing_section_message(key: str, missing: str, origin: str) -> str:
    """One line for `missing.rest` where `missing` is no section: nearest sections and keys."""
    rest = key[len(missing) + 1:]
    near = nearest_sections(missing)
    suggestions = [f"{s}.{rest}" for s in near if f"{s}.{rest}" in config_keys()]
    for s in near if not suggestions else []:
        leaves = [k[len(s) + 1:] for k in config_keys() if k.startswith(s + ".")]
        close = difflib.get_close_matches(rest, leaves, n=3, cutoff=0.6)
        suggestions += [f"{s}.{leaf}" for leaf in close]
    if not suggestions:
        suggestions = [k for k in config_keys() if k.endswith("." + rest)]
    suggestions = list(dict.fromkeys(suggestions))[:3]
    message = f"{origin}: there is no section '{missing}'"
    if near:
        message += f" (nearest: {', '.join(near)})"
    if suggestions:
        return message + f"; did you mean {', '.join(suggestions)}?"
    if near:
        example = next(k for k in config_keys() if k.startswith(near[0] + "."))
        return message + f"; set a field of {near[0]}, e.g. {example}=..."
    return message + f"; the sections are {', '.join(config_sections())}"


def unknown_key_message(key: str, origin: str) -> str:
    """One line for a key the schema lacks, naming the closest valid keys."""
    if key in _DATA_PARALLEL_NAMES:
        return (
            f"{origin}: '{key}' cannot be set; data parallel size is derived as "
            "cluster.nodes x cluster.gpus_per_node / (TP x PP x CP), so change cluster.nodes "
            "or cluster.gpus_per_node"
        )
    missing = missing_section(key)
    if missing is not None:
        return missing_section_message(key, missing, origin)
    section = key.rpartition(".")[0]
    children = (list(class_field_types(field_type(section)))
                if section and is_section(section) else [])
    if section and is_section(section) and not children:
        return f"{origin}: unknown config key '{key}'; section {section} has no settings"
    near = closest_keys(key)
    if not near and 0 < len(children) <= _LISTED_KEYS:
        return f"{origin}: unknown config key '{key}'; section {section} has {', '.join(children)}"
    sections = nearest_sections(key) if "." not in key else []
    if not near and sections:
        example = next(k for k in config_keys() if k.startswith(sections[0] + "."))
        return (
            f"{origin}: unknown config key '{key}'; did you mean the section {sections[0]}? "
            f"set one of its fields, e.g. {example}=..."
        )
    hint = f"did you mean {', '.join(near)}?" if near else "see a saved config.yaml for all keys"
    return f"{origin}: unknown config key '{key}'; {hint}"


def _list_type(key: str) -> Any | None:
    """The `list[T]` type of a list field (`| None` taken off), else None."""
    tp = field_type(key)
    if _nullable(tp):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp if typing.get_origin(tp) is list else None


def _element_words(element: Any) -> str:
    """What one element of a list field is, in words."""
    if element is PhaseConfig:
        return f"a phase, a mapping of its fields ({', '.join(class_field_types(PhaseConfig))})"
    return describe_type(element)


def list_example(key: str, origin: str = "override") -> str:
    """`key=[...]` (in a file: `key: [...]`) with a value that shows the form: the schema's
    default where it is not empty, else an example of the field or of its element type."""
    assign = "=" if origin.startswith("override") else ": "
    default = _default_of(key)
    if isinstance(default, list) and default and all(isinstance(x, str) for x in default):
        return f"{key}{assign}[{','.join(default)}]"
    list_tp = _list_type(key)
    element = typing.get_args(list_tp)[0] if list_tp is not None else None
    return f"{key}{assign}{_LIST_EXAMPLES.get(key) or _ELEMENT_EXAMPLES.get(element, '[...]')}"


def _default_of(key: str) -> Any:
    """The schema default of a dotted leaf key (None where it has none or is unknown)."""
    section, _, leaf = key.rpartition(".")
    cls = field_type(section) if section else RunConfig
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    f = next((f for f in dataclasses.fields(cls) if f.name == leaf), None)
    if f is None:
        return None
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _element_key(key: str) -> tuple[str, int] | None:
    """`train.rampup_batch_size[0]` -> ('train.rampup_batch_size', 0); else None."""
    list_key, bracket, rest = key.partition("[")
    if not bracket or not rest.endswith("]") or not rest[:-1].isdigit():
        return None
    return list_key, int(rest[:-1])


def wrong_value_message(key: str, given: str, origin: str, current: Any,
                        label: str = "currently") -> str:
    """One line for a value of the wrong type: key, expected type, given and current value
    (an element of a list: the element type and a whole list as an example); `label` says what
    the current value is (`default` where a file is merged into the schema's defaults)."""
    tp = field_type(key)
    if tp is not None and dataclasses.is_dataclass(tp):
        example = next((k for k in config_keys() if k.startswith(key + ".")), None)
        if example is None:  # e.g. plugins.packing: it follows other fields
            return f"{origin}: '{key}' is a section with no settings; remove the override"
        return (
            f"{origin}: '{key}' is a section, not a value; set one of its fields, "
            f"e.g. {example}=..."
        )
    element = _element_key(key)
    if element is not None and (list_tp := _list_type(element[0])) is not None:
        expected = _element_words(typing.get_args(list_tp)[0])
        return (f"{origin}: {key} expects {expected}, got '{given}'; write e.g. "
                f"{list_example(element[0], origin)}")
    expected = describe_type(tp) if tp is not None else "a different value"
    shown = as_written(current)
    return f"{origin}: {key} expects {expected}, got '{given}' ({label} {key}={shown})"


def list_shape_problem(update: Any, origin: str, prefix: str = "") -> str | None:
    """Where `update` (a plain tree of dicts and lists) gives a list field something OmegaConf
    cannot merge or would take: a mapping (`phases={}`: a TypeError deep in OmegaConf), or an
    element of the wrong shape (`[[1],2,3]` for a list of integers, accepted as is; `[1]` or
    `[null]` for phases). The one line, else None."""
    if not isinstance(update, dict):
        return None
    for name, value in update.items():
        key = f"{prefix}{name}"
        tp = field_type(key)
        if tp is None:
            continue  # an unknown key: the merge names it
        if dataclasses.is_dataclass(tp):
            problem = list_shape_problem(value, origin, f"{key}.")
            if problem:
                return problem
            continue
        list_tp = _list_type(key)
        if list_tp is None:
            continue
        if isinstance(value, dict):
            return f"{origin}: {key} is a list; write e.g. {list_example(key, origin)}"
        element = typing.get_args(list_tp)[0]
        for index, item in enumerate(value if isinstance(value, list) else ()):
            whole = dataclasses.is_dataclass(element)
            if (not isinstance(item, dict)) if whole else isinstance(item, (dict, list)):
                shown = _flow_yaml(item)
                return (f"{origin}: {key}[{index}] expects {_element_words(element)}, got "
                        f"'{shown}'; write e.g. {list_example(key, origin)}")
    return None


def bool_number_problem(update: Any, base: DictConfig, origin: str,
                        prefix: str = "") -> str | None:
    """Where `update` gives a true-or-false field a number other than 0 or 1 (`cpu_offload=2`,
    `-7`): OmegaConf takes any such integer as true, where the message for every other wrong
    value says true or false. The one line, else None."""
    if not isinstance(update, dict):
        return None
    for name, value in update.items():
        key = f"{prefix}{name}"
        tp = field_type(key)
        if tp is not None and dataclasses.is_dataclass(tp):
            problem = bool_number_problem(value, base, origin, f"{key}.")
            if problem:
                return problem
            continue
        if tp is None or bool not in (tp, *typing.get_args(tp)):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value not in (0, 1):
            current = OmegaConf.select(base, key, default=None)
            return wrong_value_message(key, as_written(value), origin, current)
    return None


def _flow_yaml(value: Any) -> str:
    """A value as one line of YAML flow style (`[1]`, `{a: 1}`, `null`)."""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return as_written(value)


# The text a user wrote for each key, or a function that reads it (`merge_checked`).
Typed = Mapping[str, str] | Callable[[], Mapping[str, str]]


def merge_checked(base: DictConfig, update: DictConfig, origin: str,
                  typed: Typed | None = None, label: str = "currently") -> DictConfig:
    """Merge `update` into a structured `base`, turning OmegaConf errors into ConfigErrors.

    `origin` says where the values came from (an override or a file) for the message; `typed`:
    the text the user wrote for each key, echoed as written (`1e3`, not OmegaConf's `1000.0`),
    or a function giving it, called only when a value is wrong (a file is read again for it);
    `label`: what `base`'s values are to the user (`wrong_value_message`).
    """
    plain = OmegaConf.to_container(update, resolve=False)
    problem = list_shape_problem(plain, origin) or bool_number_problem(plain, base, origin)
    if problem:
        raise ConfigError(problem)
    try:
        return typing.cast(DictConfig, OmegaConf.merge(base, update))
    except OmegaConfBaseException as err:
        if getattr(err, "object_type", None) is PhaseConfig:
            message = phase_field_message(err, origin)
        elif isinstance(err, ConfigKeyError):
            message = _unknown_key(err, update, origin)
        else:
            message = _wrong_value(err, base, update, origin, typed, label)
    raise ConfigError(message)


def phase_field_message(err: OmegaConfBaseException, origin: str) -> str:
    """One line for a phase entry with an unknown field or a value of the wrong type."""
    key = str(getattr(err, "key", "") or "")
    types_ = class_field_types(PhaseConfig)
    if key not in types_:
        near = difflib.get_close_matches(key, list(types_), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        return (f"{origin}: a phase has no field '{key}'; {hint}a phase has "
                f"{', '.join(types_)}")
    given = as_written(getattr(err, "value", None))
    return f"{origin}: a phase's {key} expects {describe_type(types_[key])}, got '{given}'"


def _unknown_key(err: ConfigKeyError, update: DictConfig, origin: str) -> str:
    key = _user_key(update, str(err.full_key or err.key or ""))
    given = OmegaConf.select(update, key, default=None) if key else None
    if isinstance(given, DictConfig) and len(given):  # a whole unknown section (a file)
        key = f"{key}.{next(iter(given.keys()))}"
    return unknown_key_message(key, origin)


def _wrong_value(err: OmegaConfBaseException, base: DictConfig, update: DictConfig,
                 origin: str, typed: Typed | None = None,
                 label: str = "currently") -> str:
    key = str(getattr(err, "full_key", "") or "") or _first_key(update)
    given = OmegaConf.select(update, key, default=None) if key else None
    if isinstance(given, DictConfig):
        given = OmegaConf.to_yaml(given).strip().replace("\n", ", ")
    texts = typed() if callable(typed) else typed
    if texts is not None and key in texts:
        given = texts[key]
    current = OmegaConf.select(base, key, default=None) if key else None
    return wrong_value_message(key, as_written(given), origin, current, label)


def _first_key(node: DictConfig) -> str:
    """The first top-level key of `node` (for errors OmegaConf reports without a key)."""
    keys = [str(k) for k in node.keys()]
    return keys[0] if keys else ""


def _user_key(update: DictConfig, missing: str) -> str:
    """Extend the first missing key OmegaConf reports to the full key the user wrote."""
    value = OmegaConf.select(update, missing, default=None) if missing else None
    while isinstance(value, DictConfig) and len(value) == 1:
        child = str(next(iter(value.keys())))
        missing, value = f"{missing}.{child}", value[child]
    return missing


def to_run_config(node: DictConfig, origin: str) -> RunConfig:
    """Convert a structured config back to the `RunConfig` dataclass (resolving `${...}`)."""
    try:
        obj = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", "") or "")
        reason = str(getattr(err, "msg", "") or err).splitlines()[0]
        raise ConfigError(
            f"{origin}: cannot resolve '{key}': {reason}; give {key or 'it'} a plain value"
        ) from None
    if not isinstance(obj, RunConfig):
        raise ConfigError(f"{origin}: did not produce a run configuration")
    return obj


def split_override(text: str) -> tuple[str, str]:
    """`a.b=c` -> ('a.b', 'c'); anything else is a one-line error saying the form."""
    key, value = split_argument(text, "optimizer.lr=2e-4", what="an override")
    if "" in key.split("."):
        raise ConfigError(
            f"'{text}': the key '{key}' has an empty part between dots; write SECTION.KEY=VALUE, "
            "e.g. optimizer.lr=2e-4"
        )
    return key, value


def _nullable(tp: Any) -> bool:
    union = isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union
    return union and type(None) in typing.get_args(tp)


def empty_value_message(key: str, origin: str, current: Any) -> str:
    """One line for `key=` with nothing after '=': what to give it (and null where allowed)."""
    tp = field_type(key)
    message = f"{origin}: {key} is empty; give it a value"
    if current is not None:
        message += f", e.g. {key}={as_written(current)}"
    else:
        message += f" ({describe_type(tp).removesuffix(' or null')})"
    if _nullable(tp):
        message += f", or {key}=null to leave it unset"
    return message


def retired_keys() -> dict[str, Retired]:
    """Every retired key: the core's and each plugin's (`PluginConfig.retired_keys`)."""
    plugins = {key: Retired(text) for key, text in PluginsConfig().retired_keys().items()}
    return {**RETIRED_KEYS, **plugins}


def retired_key_problem(key: str) -> str | None:
    """`<key> was <what became of it>; <what to set instead>` for a retired key, else None."""
    retired = retired_keys().get(key)
    return None if retired is None else f"{key} was {retired.instead}"


def carry_retired_keys(node: DictConfig) -> DictConfig:
    """A config tree an earlier version saved, with each retired key it still holds replaced by
    what now holds its value (`Retired.carries`), and a section left empty by that removed: a
    run's own config.yaml keeps working after a key moves."""
    absent = object()
    carried = []
    for key, retired in retired_keys().items():
        value = OmegaConf.select(node, key, default=absent, throw_on_resolution_failure=False)
        if value is absent:
            continue
        parent, _, leaf = key.rpartition(".")
        section = OmegaConf.select(node, parent)
        section.pop(leaf)
        if parent.startswith("plugins.") and not section:
            node.plugins.pop(parent.split(".")[1])
        carried += [f"{new}={as_written(new_value)}"
                    for new, new_value in retired.carries(value).items()]
    return OmegaConf.merge(node, OmegaConf.from_dotlist(carried)) if carried else node


def check_override_key(key: str, value: str, node: DictConfig, origin: str) -> None:
    """Refuse what OmegaConf would misread: retired, unknown sections and keys, a value used as
    a section, a section given a value, and an empty value (which OmegaConf reads as null)."""
    if retired := retired_key_problem(key):
        raise ConfigError(f"{origin}: {retired}")
    if is_section(key):
        raise ConfigError(wrong_value_message(key, value, origin, None))
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if prefix in config_keys():
            raise ConfigError(
                f"{origin}: {prefix} is a value, not a section; set it directly, "
                f"e.g. {prefix}={as_written(OmegaConf.select(node, prefix))}"
            )
    if key not in config_keys():
        raise ConfigError(unknown_key_message(key, origin))
    if not value.strip():
        raise ConfigError(empty_value_message(key, origin, OmegaConf.select(node, key)))


def _apply_override(node: DictConfig, text: str) -> DictConfig:
    """`node` with one `a.b=c` override merged in (checked; a mistake is one ConfigError)."""
    key, value = split_override(text)
    check_override_key(key, value, node, f"override '{text}'")
    try:
        update = OmegaConf.from_dotlist([text])
    except (OmegaConfBaseException, yaml.YAMLError):
        raise ConfigError(
            f"override '{text}': cannot parse the value '{value}' (unbalanced brackets or "
            f"an unfinished ${{...}}); give {key} a plain value"
        ) from None
    except ValueError as error:  # a plain value YAML cannot convert (a 5,000-digit number)
        shown = value if len(value) <= 40 else f"{value[:20]}...({len(value):,} characters)"
        raise ConfigError(f"override '{key}={shown}': {unreadable_value(error)}") from None
    return merge_checked(node, update, f"override '{text}'", typed={key: value})


def apply_overrides(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """Apply dotlist overrides in order (a later one wins) and return a new `RunConfig`."""
    node = typing.cast(DictConfig, OmegaConf.structured(cfg))
    problems = []
    for text in overrides:  # each bad override is said; the good ones still apply
        try:
            node = _apply_override(node, text)
        except ConfigError as error:
            problems.append(str(error))
    error = config_error(problems)
    if error is not None:
        raise error
    return to_run_config(node, "overrides " + " ".join(overrides) if overrides else "recipe")

"""The YAML files a user writes by hand (cluster files, blend files), read strictly.

PyYAML lets the last of two equal keys win without a word and reads `1e30` as text; a file
saved in Latin-1 or a binary file raises a decoding traceback. Here each of those is one
`ConfigError` line naming the file and the mend, so the rules that check the values after it
only ever see what the user meant; `scalar_texts` lets an error about a saved config echo a
value as the file writes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from plugins.protocol.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding one key twice."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise ConfigError(f"key '{key}' is given twice (line {key_node.start_mark.line + 1}); "
                              "keep one")
        if isinstance(key, (str, int, float, bool)):
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)

# Numbers as YAML 1.2 reads them: `1e30` is a float (YAML 1.1 wants a dot), and `4:00:00` stays
# text (YAML 1.1 reads it as 14,400 seconds in base 60, which a Slurm time limit is not).
_INT = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if not tag.endswith((":int", ":float"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def scalar_texts(text: str) -> dict[str, str]:
    """Each scalar of a YAML document as written, by its dotted key (`train.train_iters`,
    `phases[0].name`): errors echo `1e3` or `off` as the file has them, not the `1000.0` or
    `false` a loader made of them. Empty where the text is no valid YAML."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    found: dict[str, str] = {}

    def walk(node: yaml.Node | None, key: str) -> None:
        if isinstance(node, yaml.ScalarNode) and key:
            found[key] = node.value
        elif isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                walk(value, f"{key}.{key_node.value}" if key else str(key_node.value))
        elif isinstance(node, yaml.SequenceNode):
            for index, value in enumerate(node.value):
                walk(value, f"{key}[{index}]")

    walk(root, "")
    return found


def not_a_file(path: str | Path) -> str:
    """What a path that is not a readable file is, for a line naming it: a folder where a file
    is wanted is not "missing"."""
    return "is a folder, not a file" if Path(path).is_dir() else "does not exist"


def read_yaml(path: str | Path, origin: str) -> Any:
    """The YAML document in `path`; `origin` (e.g. 'cluster=conf/cluster/x.yaml') starts each
    error line. The caller checks that the file exists and what the document must hold."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{origin} is not UTF-8 text (byte {error.start}); save it as UTF-8 "
                          "YAML") from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"{origin} cannot be read ({reason}); fix its permissions") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{origin} is not valid YAML{line}; fix it") from None
    except ValueError as error:  # a plain value YAML cannot convert
        raise ConfigError(f"{origin}: {unreadable_value(error)}") from None


def unreadable_value(error: ValueError) -> str:
    """What YAML's readers of plain values raise as a ValueError (a number of more digits than
    Python converts, a date like 2026-13-45), as the middle of a one-line refusal."""
    reason = str(error).split(";")[0].strip() or type(error).__name__
    return (f"a value cannot be read ({reason}); write it plainly, or quote it to keep it "
            "text")

"""Read a Megatron-LM `pretrain_gpt.py` / `pretrain_hybrid.py` argument list into a run config,
through Megatron-LM's own argument parser (`megatron/training/arguments.py:45`,
`add_megatron_arguments`, in the wheel) and the one flag table
(`recipes/config/megatron_args.py`).

Every flag typed is accounted for: carried into the config; named as not carried when it only
says where things are or how a run reports (paths, loggers, fusions: `ENVIRONMENT_DESTS`); or,
when it changes what is trained and the project has no field for it, refused with one line per
flag. A flag Megatron-LM does not know, or a choice the project has no value for (a router
score function it does not train), is refused the same way. The world size is not a
Megatron-LM flag: `cluster.nodes` / `cluster.gpus_per_node` overrides give it (default: one
node of TP x PP x CP ranks, one replica).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import re
import shlex
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.config.megatron_args import (
    ENVIRONMENT_DESTS,
    FLAGS,
    MEGATRON_ARGS_NAME,
    carried_dests,
    from_megatron_values,
    missing_always_on,
    softmax_precision_note,
)
from recipes.config.schema import ClusterConfig, RunConfig


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser, built once (its 800 arguments take seconds to add); the one the
    trainer writes a checkpoint's Megatron-LM `args` with."""
    from trainer.mcore_translation import megatron_lm_parser

    return megatron_lm_parser()


def read_argument_file(path: str) -> list[str]:
    """A launch script's arguments: shell words after the script name (line continuations and
    comments allowed); everything up to the script (`pretrain_gpt.py`), or else before the
    first `--flag`, is the launcher."""
    return read_launch_file(path)[0]


def read_launch_file(path: str) -> tuple[list[str], tuple[int, int] | None]:
    """`read_argument_file`'s arguments, and the (nodes, processes per node) its torchrun
    launcher gives (`--nnodes`, `--nproc-per-node`), None without both: the world size is
    torchrun's, not a flag, and `print=megatron_args` writes it there."""
    words = shell_words(path, file_text(path))
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    argv = words[script + 1:] if script is not None else words[first:]
    if not any(word.startswith("--") for word in argv):
        raise ConfigError(f"megatron_args={path} holds no pretrain_gpt.py flags (--num-layers "
                          "...); give a Megatron-LM launch line (a saved config.yaml goes in "
                          "config=)")
    return argv, launcher_size(words[:script] if script is not None else [])


def launcher_size(words: list[str]) -> tuple[int, int] | None:
    """(nodes, processes per node) from torchrun's words, None unless both are whole numbers
    (`--nnodes=2`, `--nproc-per-node 8`, `--nproc_per_node=8`; an elastic `1:4` is no size)."""
    found: dict[str, str] = {}
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        name = name.replace("_", "-")
        if name in ("--nnodes", "--nproc-per-node"):
            found[name] = value if equals else (words[index + 1] if index + 1 < len(words)
                                                else "")
    nodes, per_node = found.get("--nnodes", "1"), found.get("--nproc-per-node", "")
    if not (nodes.isdigit() and per_node.isdigit()) or not int(nodes) or not int(per_node):
        return None
    return int(nodes), int(per_node)


WANTED = ("give a file holding the pretrain_gpt.py arguments (one shell line or several "
          "with \\)")


def file_text(path: str) -> str:
    """The file's text, or one line that says why it cannot be read (a directory, missing,
    unreadable, not UTF-8 text) and what to give instead, so no OSError or UnicodeDecodeError
    traceback reaches the user."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"megatron_args={path} is a directory; {WANTED}")
    if not file.is_file():
        raise ConfigError(f"megatron_args={path} does not exist; {WANTED}")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"megatron_args={path} is not UTF-8 text (byte 0x"
                          f"{error.object[error.start]:02x} at offset {error.start}); "
                          f"{WANTED}") from None
    except OSError as error:
        raise ConfigError(f"megatron_args={path} cannot be read ({error.strerror}); "
                          f"{WANTED}") from None


def shell_words(path: str, text: str) -> list[str]:
    """The text split as the shell would (shlex); an unmatched quote or a trailing escape (a
    README or other prose given by mistake) is one line naming the file, not a ValueError."""
    try:
        return shlex.split(text, comments=True)
    except ValueError as error:
        raise ConfigError(f"megatron_args={path} is not a shell argument list ({error}); "
                          f"{WANTED}") from None


def quiet_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A copy of the shared (cached) Megatron-LM parser that raises `ArgumentError` instead of
    printing its 660-line usage and exiting: `exit_on_error=False` covers a bad value
    (`_parse_known_args` raises), the `error()` override the checks that call `error()` directly
    (required arguments, ambiguous options: argparse 3.12 exits there whatever exit_on_error)."""
    quiet = copy.copy(parser)
    quiet.exit_on_error = False

    def refuse(message: str) -> typing.NoReturn:
        raise argparse.ArgumentError(None, message)

    quiet.error = refuse  # type: ignore[method-assign]
    return quiet


def argument_error_line(error: argparse.ArgumentError, source: str | None) -> str:
    """One line for a flag Megatron-LM's parser refused: the file, the flag, the value and the
    fix (argparse's own message alone names neither the file nor what to type)."""
    where = f"megatron_args={source}: " if source else ""
    flag, message = error.argument_name, error.message
    if flag is None:
        return f"{where}{message}; fix the Megatron-LM arguments in the file"
    bad = re.fullmatch(r"invalid (\w+) value: (.*)", message)
    if bad:
        kind = {"int": "a whole number", "float": "a number"}.get(bad[1], f"a {bad[1]} value")
        return f"{where}{flag} {bad[2]} is not {kind}; give {flag} {kind}"
    choice = re.fullmatch(r"invalid choice: (.*) \(choose from (.*)\)", message)
    if choice:
        return f"{where}{flag} {choice[1]} is not a choice; give {flag} one of {choice[2]}"
    if message.startswith("expected"):
        return (f"{where}{flag} has no value ({message}); put its value after it, "
                f"e.g. {flag} VALUE, or remove the flag")
    explicit = re.fullmatch(r"ignored explicit argument (.*)", message)
    if explicit:
        return f"{where}{flag} takes no value (given {explicit[1]}); write {flag} alone"
    return f"{where}{flag}: {message}; fix {flag} in the file"


def parse_megatron_argv(parser: argparse.ArgumentParser, argv: Sequence[str],
                        source: str | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Megatron-LM's parse of `argv` (the namespace and the words it does not know); a value
    it refuses is a ConfigError of one line (`argument_error_line`), never argparse's usage."""
    try:
        return quiet_parser(parser).parse_known_args(list(argv))
    except argparse.ArgumentError as error:
        raise ConfigError(argument_error_line(error, source)) from None


def _given_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, str]:
    """dest -> the option string typed, for every flag on the command line."""
    by_option = {o: a.dest for a in parser._actions for o in a.option_strings}
    found = {}
    for word in argv:
        option = word.split("=", 1)[0]
        if option in by_option:
            found[by_option[option]] = option
    return found


def _unknown_lines(parser: argparse.ArgumentParser, unknown: list[str]) -> list[str]:
    options = [o for a in parser._actions for o in a.option_strings]
    lines = []
    for word in unknown:
        if not word.startswith("--"):
            continue
        near = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.8)
        hint = f"did you mean {near[0]}?" if near else "remove it"
        lines.append(f"{word} is not a Megatron-LM pretrain_gpt.py flag; {hint}")
    return lines


def _choices(section: Any, name: str) -> tuple | None:
    """The values a `Literal` field of the schema allows (None: not a Literal field)."""
    hint = typing.get_type_hints(type(section)).get(name)
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def _unexpressible_values(cfg: RunConfig, fields: dict[str, Any]) -> list[str]:
    """One line per Megatron-LM choice the project's field has no value for (e.g.
    `--moe-router-score-function sqrtsoftplus`)."""
    flags = {f.field: f.flag for f in FLAGS}
    lines = []
    for dotted, value in fields.items():
        name = dotted.rsplit(".", 1)[1]
        value = _single(value)
        choices = _choices(_section_of(cfg, dotted), name)
        if choices and value is not None and value not in choices:
            flag = flags.get(dotted, dotted)
            lines.append(f"{flag} {value} is not one the project trains ({dotted} is one of "
                         f"{', '.join(map(str, choices))}); use one of those or remove the flag")
    return lines


def _section_of(cfg: RunConfig, dotted: str) -> Any:
    """The config section a dotted field lives in ('section.name' or 'plugins.<plugin>.name')."""
    target = cfg
    for section in dotted.split(".")[:-1]:
        target = getattr(target, section)
    return target


def _single(value: Any) -> Any:
    """Megatron-LM parses a few flags as lists (`--moe-router-load-balancing-type`): one value."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _apply(cfg: RunConfig, fields: dict[str, Any]) -> None:
    for dotted, value in fields.items():
        target = _section_of(cfg, dotted)
        name = dotted.rsplit(".", 1)[1]
        current = getattr(target, name)
        if isinstance(value, list) and len(value) == 1 and not isinstance(current, list):
            value = value[0]  # a one-word nargs flag for a scalar field (a list field stays one)
        if value is None and current is not None:
            continue  # Megatron-LM's "unset": the project's default stands
        setattr(target, name, _as_type_of(current, value))


def _as_type_of(current: Any, value: Any) -> Any:
    """Megatron-LM types a few numbers otherwise (`--loss-scale-window` is a float)."""
    if isinstance(current, bool) or isinstance(value, bool):
        return value
    if isinstance(current, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(current, float) and isinstance(value, int):
        return float(value)
    return value


def config_from_megatron_args(argv: Sequence[str], cluster: ClusterConfig | None = None,
                              source: str | None = None,
                              launched: tuple[int, int] | None = None,
                              ) -> tuple[RunConfig, list[str]]:
    """The run config a Megatron-LM argument list trains, and one note per flag typed that
    the config does not carry. Unknown and unsupported flags: ConfigError, one line each
    (naming `source`, the file the list was read from, when given). Its machines: `cluster`,
    else the (nodes, processes per node) its launcher gave (`launched`), else one node of
    TP x PP x CP ranks."""
    parser = megatron_parser()
    namespace, unknown = parse_megatron_argv(parser, argv, source)
    given = _given_dests(parser, argv)
    carried, problems, notes = carried_dests(), _unknown_lines(parser, unknown), []
    for dest, option in given.items():
        if dest in carried:
            continue
        if dest in ENVIRONMENT_DESTS:
            notes.append(f"not carried: {option} (where things are or how a run reports; "
                         "the project's own settings apply)")
        else:
            problems.append(f"{option} is a Megatron-LM flag the project cannot express (no "
                            "config field changes what it changes); remove it to plan the rest")
    if problems:
        raise ConfigError("\nerror: ".join(problems))
    notes += missing_always_on(set(given))
    values = {**vars(namespace), "__given__": frozenset(given)}
    cfg = RunConfig(name=MEGATRON_ARGS_NAME)
    fields = from_megatron_values(values)
    problems = _unexpressible_values(cfg, fields)
    if problems:
        raise ConfigError("\nerror: ".join(problems))
    _apply(cfg, fields)
    notes += softmax_precision_note(given, cfg.precision.dtype)
    p = cfg.parallel
    nodes, per_node = launched or (1, p.tensor * p.pipeline * p.context)
    cfg.cluster = cluster or ClusterConfig(nodes=nodes, gpus_per_node=per_node)
    return cfg, notes


def with_cluster(cfg: RunConfig, nodes: int, gpus_per_node: int) -> RunConfig:
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, nodes=nodes,
                                                                gpus_per_node=gpus_per_node))

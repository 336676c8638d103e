"""The one `key=value` parser every command line goes through.

Every script takes `key=value` words (and, where a script says so, a few `--flags` or plain
words). This module splits a word into its key and value, names a type in words, and turns the
text of a value into its type, each mistake one line with an example: the run config's
overrides (`overrides.py`), data preparation's arguments (`data_prep/config.py`) and every
script's own options (`trainer/entry/contract.py`) use these and nothing else.

Types are Python annotations: `int`, `float`, `bool`, `str`, `Literal["a", "b"]`, `list[T]`
(`[1,2,4]` or `1,2,4`), and any of them `| None` (the value `null` or `none`). A float accepts
`15e12`; an int accepts `1_000` and a whole number written as a float, read exactly
(`15e12`, `1e30` = 10**30; `1.5` is refused). `as_written` is the way back: a value as a
`key=value` word writes it, the one form every command line's messages quote.
"""

from __future__ import annotations

import decimal
import math
import re
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from plugins.protocol.errors import ConfigError

NULL_WORDS = ("null", "none")
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def as_written(value: Any) -> str:
    """A value as a `key=value` word writes it, for a message to quote: null for None,
    true/false for a bool (the spelling the docs and --help use, not Python's True), anything
    else as `str` prints it. Every command line's messages (overrides, the scripts' options,
    data preparation's arguments, the planner's commands) quote values through this one."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def with_replaced(words: Sequence[str], replacements: Sequence[str]) -> list[str]:
    """`key=value` words as a command line reads them (the last value of a key wins) with the
    keys `replacements` set dropped and `replacements` after them: one word per key, so a
    command printed or handed on says each setting once."""
    replaced = {word.partition("=")[0] for word in replacements}
    kept: dict[str, str] = {}
    for word in words:
        key = word.partition("=")[0]
        if key not in replaced:
            kept.pop(key, None)
            kept[key] = word
    return [*kept.values(), *replacements]


def split_argument(text: str, example: str, what: str = "an argument") -> tuple[str, str]:
    """`key=value` -> ('key', 'value'); anything else is a one-line error saying the form, with
    `example` (e.g. 'optimizer.lr=2e-4'); `what` names the word ('an override')."""
    key, sep, value = text.partition("=")
    if text.startswith("-"):
        raise ConfigError(f"'{text}' is not {what}; write KEY=VALUE without dashes, e.g. "
                          f"{example} (--help shows the usage)")
    if not sep or not key or key != key.strip():
        raise ConfigError(f"'{text}' is not {what}; write KEY=VALUE with no spaces around '=', "
                          f"e.g. {example}")
    return key, value


def is_nullable(tp: Any) -> bool:
    union = isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union
    return union and type(None) in typing.get_args(tp)


def _base(tp: Any) -> Any:
    """The type without its `| None`."""
    if is_nullable(tp):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def literal_options(tp: Any) -> tuple[Any, ...]:
    """The allowed values of a `Literal[...]` (or `Literal[...] | None`) type, else ()."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return tuple(v for arg in typing.get_args(tp) for v in literal_options(arg))
    return ()


def describe_type(tp: Any) -> str:
    """A type in words: 'an integer', 'an integer or null', 'one of a, b', 'true or false'."""
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(v) for v in typing.get_args(tp))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        names = [describe_type(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(names) + " or null"
    if typing.get_origin(tp) is list:
        item = describe_type(typing.get_args(tp)[0]).removeprefix("an ").removeprefix("a ")
        return f"a list of {item}s"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# Digits an integer option may have: Python refuses to print an int of more than 4,300 digits
# (sys.get_int_max_str_digits), and `1e999999999` would take minutes to build.
MAX_INTEGER_DIGITS = 1000


def exact_integer(text: str) -> int | None:
    """`text` as the whole number it writes, exactly: `1_000`, `15e12` and `1.5e3` are whole
    numbers, `1e30` is 10**30 (a float would make it 1,000,000,000,000,000,019,884,624,838,656);
    None for a fraction (`1.5`), a non-number, or more than MAX_INTEGER_DIGITS digits."""
    if re.fullmatch(r"[+-]?\d[\d_]*", text):
        return int(text.replace("_", "")) if len(text) <= MAX_INTEGER_DIGITS else None
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    if not number.is_finite() or number.adjusted() >= MAX_INTEGER_DIGITS:
        return None
    return int(number) if number == number.to_integral_value() else None


def convert(key: str, text: str, tp: Any, example: str) -> Any:
    """The text of `key=text` as type `tp`, or a one-line `ConfigError` naming the type and
    giving `example` (a whole `key=value`)."""
    if is_nullable(tp) and text.lower() in NULL_WORDS and text not in literal_options(tp):
        return None  # `none` is a value where the choices name it (sharding=none), not null
    base = _base(tp)
    value: Any = None
    if typing.get_origin(base) is list:
        if text.strip().startswith("[") != text.strip().endswith("]"):  # `[1,2` cut short
            raise ConfigError(f"{key} expects {describe_type(tp)}, got '{text}' (a bracket "
                              f"left open); e.g. {example}")
        items = [item.strip() for item in text.strip().strip("[]").split(",") if item.strip()]
        return [convert(key, item, typing.get_args(base)[0], example) for item in items]
    if literal_options(base):
        value = text if text in literal_options(base) else None
    elif base is str:
        value = text
    elif base is bool:
        value = True if text.lower() in TRUE_WORDS else False if text.lower() in FALSE_WORDS \
            else None
    elif base is int:
        value = exact_integer(text)
    elif base is float:
        value = _number(text)
    if value is None:
        raise ConfigError(f"{key} expects {describe_type(tp)}, got '{text}'; e.g. {example}")
    return value

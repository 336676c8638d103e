"""The one entry contract: every script is a few lines around one `Command`, and `main` gives
each the same command line, `--help`, one-line errors and exit codes.

A command line is `key=value` words (recipes/config/arguments.py parses every one), a few
`--flags` where a command has them, and what the command takes besides (`rest`: the recipe and
its overrides, run directories, a sub-command). `main`:

    --help / -h / help      print the script's docstring (its usage), its options, and for a
                            command that takes a recipe the recipe list; exit 0
    parse                   the command's own options (typed, with defaults; each one choice,
                            so one given twice is refused), its flags, and the rest in order
                            (a config override given twice: the later wins, as in Megatron-LM's
                            command line); anything else is refused in one line
    run                     the command's function, in this process: a local command does its
                            work here; a training command hands over to the training pipeline
                            (trainer/entry/pipeline.py), which launches ranks or is one
    errors                  a `UserError` anywhere (ConfigError before launch, a plugin's at run
                            time) is printed once as `error: <what and how to fix>`, exit 2;
                            several found together (ConfigErrors) are one such line each

Exit codes (plugins/protocol/errors.py): 0 done, 1 a run or a check failed, 2 a user mistake,
3 a non-finite loss or gradient, 130 Ctrl-C, 141 the output's reader stopped early. Environment
a command must set before its heavy imports (threads, hidden GPUs) is set here, first.
"""

from __future__ import annotations

import ast
import difflib
import errno
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugins.protocol.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    RankUserError,
    UserError,
    error_lines,
)
from recipes.config.arguments import (
    as_written,
    convert,
    describe_type,
    literal_options,
    split_argument,
)
from recipes.resolve import ListRecipesRequested
from trainer.entry.library_noise import quiet_known_noise

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HELP_ARGS = ("--help", "-h", "help")


@dataclass(frozen=True)
class Option:
    """A command's own `key=value` option: its default, one line of help, its type (a Python
    annotation, recipes/config/arguments.py), and an optional check of the parsed value that
    returns the one-line problem or None."""

    default: Any
    help: str
    type: Any = int
    check: Callable[[str, Any], str | None] | None = None


def positive(key: str, value: Any) -> str | None:
    """`check` for a count that must be at least 1."""
    if value is not None and value < 1:
        return f"{key}={value} must be a positive whole number, e.g. {key}=2"
    return None


def non_negative(key: str, value: Any) -> str | None:
    if value is not None and value < 0:
        return f"{key}={value} must be 0 or more, e.g. {key}=0"
    return None


@dataclass(frozen=True)
class Arguments:
    """A parsed command line: the options (every one, defaults filled in), the flags given,
    the rest in order, and which options were given: one typed at its default value is given
    all the same (a command refusing an option it would ignore refuses it too)."""

    options: dict[str, Any]
    flags: frozenset[str] = frozenset()
    rest: tuple[str, ...] = ()
    script: Path = SCRIPTS / "pretrain.py"  # the script run (training commands relaunch it)
    given: frozenset[str] = frozenset()

    def __getitem__(self, key: str) -> Any:
        return self.options[key]


@dataclass(frozen=True)
class Command:
    """One script: its file (whose docstring is its usage), what it runs, and its arguments."""

    script: str  # file name in scripts/, e.g. "pretrain.py"
    run: Callable[[Arguments], int]
    options: Mapping[str, Option] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # e.g. ("--json",)
    # What the command takes besides its options and flags, in words for errors and --help
    # (e.g. "recipe=NAME | config=FILE and section.field=value overrides"); None: nothing.
    rest: str | None = None
    takes_recipe: bool = False  # --help lists the recipes
    # The recipe run when none is named, where it is not the project's default (--help says so).
    default_recipe: str | None = None
    # --help: what the command handles besides the recipe list (e.g. the model families it
    # converts), computed when asked from the list the code itself uses, so it cannot drift.
    handles: Callable[[], str] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)  # set before anything runs
    # A recipe command's lookup of the scripts whose option a word is (`pretrain.py search=`:
    # plan.py's), handed in where every command is known (trainer/entry/commands.py, whose
    # `recipe_command` gives it to each): this module knows no command but the one it runs.
    option_owners: Callable[[str], Sequence[str]] | None = None

    @property
    def path(self) -> Path:
        return SCRIPTS / self.script


def _config_keys() -> frozenset[str]:
    """What a recipe command's rest may start with: recipe=, config=, a run config field."""
    import dataclasses

    from recipes.config.schema import RunConfig

    return frozenset({"recipe", "config", *(f.name for f in dataclasses.fields(RunConfig))})


def _misplaced_option(command: Command, key: str | None) -> str | None:
    """A word a recipe command would hand on as a config override though it is no config key:
    another script's option (`pretrain.py search=true`, plan.py's: the command's
    `option_owners` says whose), or one close to this command's own (`plan.py clustr=`). The
    line that says so; None for anything else, which the override's own check judges."""
    if not command.takes_recipe or key is None or "." in key or key in _config_keys():
        return None
    if key in command.options:
        return None
    owners = list(command.option_owners(key)) if command.option_owners else []
    if owners:
        named = " and ".join(f"scripts/{s}" for s in owners[:2])
        more = f" (and {len(owners) - 2} more)" if len(owners) > 2 else ""
        return f"{key}= is an option of {named}{more}, not of {command.script}; run it there"
    near = difflib.get_close_matches(key, list(command.options), n=1, cutoff=0.75)
    return f"unknown option {key}; did you mean {near[0]}=?" if near else None


def script_usage(command: Command) -> str:
    """The script's docstring, read without importing it (the script may import heavy things
    or set the environment first)."""
    return ast.get_docstring(ast.parse(command.path.read_text(encoding="utf-8"))) or ""


def help_text(command: Command) -> str:
    """The script's usage, its own options, what it handles, then (commands that take a recipe)
    every recipe."""
    lines = [script_usage(command).strip(), ""]
    if command.options:
        lines.append("options:")
        for key, option in command.options.items():
            default = as_written(option.default)
            lines.append(f"  {key}=  {option.help} ({describe_type(option.type)}, default "
                         f"{default})")
        lines.append("")
    if command.handles is not None:
        lines += [command.handles().rstrip(), ""]
    text = "\n".join(lines)
    if command.takes_recipe:
        from recipes.registry import format_recipe_list

        text += "\n" + format_recipe_list(command.default_recipe)
    return text.rstrip() + "\n"


def _example(key: str, option: Option) -> str:
    """A `key=value` a refusal shows: a real value where one is known (`real_example`), else
    the default as typed."""
    return real_example(key, option) or f"{key}={as_written(option.default)}"


def real_example(key: str, option: Option) -> str | None:
    """A `key=value` the option takes that sets something: its default when it has one; for a
    null default (which an example would only restate as `key=null`, no help to someone who
    typed `key=`) its first choice, an `e.g. N` its help gives, or the first file its help's
    path pattern (`conf/cluster/*.yaml`) matches. None when none is known."""
    if option.default is not None:
        return f"{key}={as_written(option.default)}"
    choices = [c for c in literal_options(option.type) if c is not None]
    if choices:
        return f"{key}={choices[0]}"
    given = re.search(r"e\.g\. ([^\s,;)]+)", option.help)
    if given and not isinstance(_quiet_convert(key, given[1], option), (str, type(None))):
        return f"{key}={given[1]}"
    pattern = next((w.rstrip(":,;") for w in option.help.split() if "*" in w or "<" in w), None)
    if pattern and not pattern.startswith("/"):  # Path.glob takes relative patterns only
        matches = sorted(SCRIPTS.parent.glob(re.sub(r"<[^>]*>", "*", pattern)))
        if matches:
            return f"{key}={matches[0].relative_to(SCRIPTS.parent)}"
    return None


def _quiet_convert(key: str, text: str, option: Option) -> Any:
    """`text` as the option's type, or None where it is not one."""
    from plugins.protocol.errors import ConfigError

    try:
        return convert(key, text, option.type, key)
    except ConfigError:
        return None


def empty_value_line(key: str, option: Option) -> str:
    """The refusal of `key=` with nothing after '=': a real value to give (not `key=null`,
    which only restates the default) or, where none is known, what the option takes, and that
    leaving the option out keeps the default."""
    example = real_example(key, option)
    kind = describe_type(option.type).removesuffix(" or null")
    give = (f"give it a value, e.g. {example}" if example else
            f"give it a value ({kind}: {option.help.split(' (')[0]})")
    return (f"{key}= is empty; {give}, or leave {key}= out for the default "
            f"({as_written(option.default)})")


def _unknown(command: Command, text: str) -> str:
    known = [f"{key}=" for key in command.options] + list(command.flags)
    offered = ", ".join(known) if known else "no options"
    return (f"{command.script} does not take '{text}'; it takes {offered} (--help shows the "
            "usage)")


def _near_flag(command: Command, text: str) -> str | None:
    """A `--flag` close to one of the command's own (`--dryrun` for `--dry-run`): refused with
    the flag it was likely meant to be, not passed on as a config override or ignored."""
    if not text.startswith("-") or "=" in text or not command.flags:
        return None

    def likeness(flag: str) -> float:
        return difflib.SequenceMatcher(None, text, flag).ratio()

    near = max(command.flags, key=likeness)  # the first declared of equals: the usual spelling
    return near if likeness(near) >= 0.8 else None


def _dashed_option(command: Command, text: str) -> str | None:
    """The command's option that an argparse-style `--out` (or `-o`, when one option starts
    with that letter) names: said as such, not taken for a run directory or an override."""
    if not text.startswith("-") or text in command.flags:
        return None
    name = text.lstrip("-").partition("=")[0].replace("-", "_")
    if len(text) - len(text.lstrip("-")) == 1 and len(name) == 1:
        initial = [option for option in command.options if option.startswith(name)]
        return initial[0] if len(initial) == 1 else None
    return name if name in command.options else None


def _own_namespace(command: Command, key: str | None) -> list[str]:
    """The command's options in the dotted namespace of `key` (`scaling.size` -> every
    `scaling.*` option), so a mistyped one is refused here, not passed on as an override."""
    if key is None or "." not in key:
        return []
    prefix = key.split(".")[0] + "."
    return [name for name in command.options if name.startswith(prefix)]


def _option_value(command: Command, key: str, text: str) -> Any:
    """One option's typed and checked value; its mistake is one ConfigError."""
    from plugins.protocol.errors import ConfigError

    option = command.options[key]
    _, raw = split_argument(text, _example(key, option))
    if not raw.strip():
        raise ConfigError(empty_value_line(key, option))
    value = convert(key, raw, option.type, _example(key, option))
    problem = option.check(key, value) if option.check else None
    if problem:
        raise ConfigError(problem)
    return value


def parse_arguments(command: Command, argv: Sequence[str]) -> Arguments:
    """Split and type a command line (module docstring); every mistake found is said, each in
    one line (a ConfigError, or ConfigErrors for several)."""
    from plugins.protocol.errors import ConfigError, config_error

    values = {key: option.default for key, option in command.options.items()}
    flags, rest, problems = set(), [], []
    given: dict[str, str] = {}  # each option's text as typed, to name both of one given twice
    value_of_dashed = False  # the argument after `--out` is its value, not a mistake of its own
    for text in argv:
        if value_of_dashed and "=" not in text and not text.startswith("-"):
            value_of_dashed = False
            continue
        value_of_dashed = False
        if text in command.flags:
            flags.add(text)
            continue
        key = text.partition("=")[0] if "=" in text else None
        namespace = _own_namespace(command, key)
        if key not in command.options and namespace:
            near = difflib.get_close_matches(key, namespace, n=1)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(namespace)}"
            problems.append(f"unknown option {key}; {hint}")
        elif key in command.options:
            try:
                value = _option_value(command, key, text)
            except ConfigError as error:
                problems.append(str(error))
                continue
            if key in given:
                problems.append(f"{key}= given twice ({given[key]}, {text.partition('=')[2]}); "
                                "keep one")
            given[key] = text.partition("=")[2]
            values[key] = value
        elif _misplaced_option(command, key):
            problems.append(_misplaced_option(command, key))
        elif _near_flag(command, text):
            problems.append(f"{command.script} does not take '{text}'; did you mean "
                            f"{_near_flag(command, text)}?")
        elif _dashed_option(command, text):
            option = _dashed_option(command, text)
            problems.append(f"{command.script} takes {option}=VALUE, not '{text}' (its options "
                            f"are key=value); write {option}=...")
            value_of_dashed = "=" not in text
        elif command.rest is not None:
            rest.append(text)
        else:
            problems.append(_unknown(command, text))
    error = config_error(problems)
    if error is not None:
        raise error
    return Arguments(values, frozenset(flags), tuple(rest), command.path, frozenset(given))


def main(command: Command, argv: Sequence[str] | None = None) -> int:
    """A script's whole life: help, or parse and run, with every user mistake one line and
    exit code 2. Output piped into a reader that stops early (`recipe=list | head`) ends the
    script quietly, as a shell tool does, not with a BrokenPipeError traceback."""
    try:
        return _main(command, argv)
    except BrokenPipeError:
        # Python's own advice (docs: signal, "Note on SIGPIPE"): point stdout at /dev/null so
        # the interpreter's flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(command: Command, argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.update(command.environment)
    quiet_known_noise()  # library warnings known to be harmless here (library_noise.py)
    if any(arg in HELP_ARGS for arg in argv):
        print(help_text(command))
        return 0
    try:
        return command.run(parse_arguments(command, argv))
    except ListRecipesRequested:  # recipe=list, anywhere a recipe is resolved
        print(help_text(command))
        return 0
    except UserError as error:  # ConfigError, and plugins' run-time refusals
        for line in error_lines(error):  # several mistakes found together: one line each
            print_once(f"error: {line}", every_rank=isinstance(error, RankUserError))
        return EXIT_USER_ERROR
    except OSError as error:
        line = os_error_line(error, argv, command.script)
        if line is None:
            raise
        # A full disk may meet one rank alone (its own files); a name too long meets them all.
        print_once(f"error: {line}", every_rank=error.errno != errno.ENAMETOOLONG)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:  # Ctrl-C outside a run's steps (which stop at a boundary)
        if "LOCAL_RANK" not in os.environ:  # a rank's launcher says it
            print(f"stopped by Ctrl-C (SIGINT): {command.script} ended", file=sys.stderr,
                  flush=True)
        return EXIT_INTERRUPTED


def os_error_line(error: OSError, argv: Sequence[str], script: str) -> str | None:
    """The one line for an OSError no rule of the command turned into its own: a path too long
    for the file system or one behind a folder this user may not enter (Python 3.12's
    Path.exists() and is_dir() raise both where they answer False for any other missing path,
    so any rule looking at one meets them), a file or folder this user may not open, or a file
    system that filled (or a quota reached) while the command wrote; None for any other
    error."""
    if error.errno == errno.ENAMETOOLONG:
        return name_too_long_line(str(error.filename or ""), argv)
    if error.errno in (errno.EACCES, errno.EPERM) and error.filename:
        return permission_line(str(error.filename), argv)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {error.filename}" if error.filename else ""
        return (f"scripts/{script} could not finish: {error.strerror}{where}; free space there (or "
                "raise the quota), or point its output at another file system, and run it again")
    return None


def naming_argument(filename: str, argv: Sequence[str]) -> str:
    """The argument that names `filename` (its value the path, or a folder the path lies in),
    else the path itself."""
    return next((arg for arg in argv if (value := arg.partition("=")[2] or arg)
                 and (os.path.abspath(filename) + os.sep).startswith(
                     os.path.abspath(value) + os.sep)), filename)


def name_too_long_line(filename: str, argv: Sequence[str]) -> str:
    """The line for a path the file system refused as too long (ENAMETOOLONG): the argument
    that names it and its longest name."""
    longest = max((len(part.encode()) for part in Path(filename).parts), default=0)
    return (f"{naming_argument(filename, argv)}: the file system refuses {filename} as too "
            f"long (its longest name is {longest:,} bytes; most allow 255 a name and 4,095 a "
            "path); shorten it")


def permission_line(filename: str, argv: Sequence[str]) -> str:
    """The line for a path this user may not open or reach (EACCES, EPERM): the argument that
    names it, and the two ways out."""
    return (f"{naming_argument(filename, argv)}: permission denied on {filename} (it, or a "
            "folder on its path, is closed to this user); open it to this user, or use a path "
            "this user can reach")


def print_once(line: str, every_rank: bool = False) -> None:
    """Print on rank 0 only (every rank of a run meets the same mistake), or on whichever rank
    calls it with `every_rank` (a mistake that rank met alone)."""
    if every_rank or os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)

"""`scripts/convert.py`'s commands: parse, check what is cheap first, convert, print the figures.

Why apart from the script: the script stays a thin, torch-light entry (a mistake in the command
line, the Hugging Face config or the recipe is refused in about a second, before torch and
Megatron are imported), and the tests drive the same functions. The command line is parsed by
the entry contract (trainer/entry/commands.py, CONVERT); every user mistake is a `ConfigError`,
printed as one line with exit code 2.
"""

from __future__ import annotations

import difflib
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError

COMMANDS = {"import": ("hf", "out"), "export": ("checkpoint", "out")}
OPTIONAL = {"export": ("max_shard_size",)}


@dataclass
class Request:
    command: str
    paths: dict[str, Path] = field(default_factory=dict)
    options: dict[str, int] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)  # recipe=/config= and overrides (import)


def command_problem(words: Sequence[str]) -> str | None:
    """The first word must be the sub-command: none given, or an option or override first
    (`convert.py hf=DIR ...`), says so; an unknown word is named with the nearest command."""
    if words and words[0] in COMMANDS:
        return None
    if not words or "=" in words[0] or words[0].startswith("-"):
        return ("convert.py needs a command first: import or export (e.g. convert.py import "
                "hf=DIR out=DIR recipe=NAME)")
    near = difflib.get_close_matches(words[0], list(COMMANDS), n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}?" if near else "give import or export"
    return f"convert.py has no command '{words[0]}'; {hint} (--help shows usage)"


def misspelled_option(command: str, rest: Sequence[str]) -> str | None:
    """A word after the command that reads as a misspelling of one of its options (`hf_dir=`,
    `output=` for `hf=`, `out=`): named with the option, rather than passed on as a config
    override or reported as the option missing. A run-config field (`run_dir=`), a dotted
    override and recipe=/config= are left to the recipe's own checks."""
    import dataclasses

    from recipes.config.schema import RunConfig

    config_keys = {"recipe", "config", *(f.name for f in dataclasses.fields(RunConfig))}
    options = (*COMMANDS[command], *OPTIONAL.get(command, ()))
    for word in rest:
        key = word.partition("=")[0]
        if "=" not in word or "." in key or key in config_keys or key in options:
            continue
        near = [option for option in options if key.startswith(option)
                or (len(key) > 1 and option.startswith(key))]
        near = near or difflib.get_close_matches(key, options, n=1, cutoff=0.6)
        if near:
            return f"unknown option {key}; did you mean {near[0]}=?"
    return None


def make_request(words: Sequence[str], given: Mapping[str, Any]) -> Request:
    """The conversion a parsed command line asks for: `words` are the sub-command, then (import)
    the recipe and its overrides; `given` the options, None where not given."""
    problem = command_problem(words)
    if problem:
        raise ConfigError(problem)
    request = Request(words[0], rest=list(words[1:]))
    required, optional = COMMANDS[request.command], OPTIONAL.get(request.command, ())
    problem = misspelled_option(request.command, request.rest)
    if problem:
        raise ConfigError(problem)
    for key, value in given.items():
        if value is None:
            continue
        if key in required:
            request.paths[key] = Path(value)
        elif key in optional:
            request.options[key] = value
        else:
            raise ConfigError(f"{request.command} does not take {key}=; it takes "
                              f"{' '.join(f'{k}=' for k in (*required, *optional))}")
    if request.command == "export" and request.rest:
        raise ConfigError(f"export does not take '{request.rest[0]}'; it takes checkpoint=DIR "
                          "out=DIR [max_shard_size=BYTES]")
    missing = [key for key in required if key not in request.paths]
    if missing:
        raise ConfigError(f"{request.command} needs {' '.join(f'{k}=DIR' for k in missing)}; "
                          "--help shows usage")
    if request.paths["out"].exists():  # before any heavy import; checked again before writing
        raise ConfigError(f"out={request.paths['out']} already exists; choose a new directory "
                          "or remove it")
    problem = out_problem(request.command, request.paths["out"])
    if problem:
        raise ConfigError(problem)
    return request


def out_problem(command: str, out: Path) -> str | None:
    """The new `out=` directory can be made, tried for real (`directory_problem`, nothing left
    behind): a parent that is a file or cannot be created is one line here, before torch and
    the ranks, not an OSError in rank 0 at its temporary directory (`hf_files.temporary_dir`,
    beside `out`, so the same folder)."""
    from recipes.config.path_rules import directory_problem

    return directory_problem("out", str(out), f"name a new directory in a folder you can "
                                              f"write, e.g. out={Path.cwd() / (command + 'ed')}")


def import_config(request: Request):
    """The recipe to import for (before torch): its config, checked against the HF config."""
    from recipes.resolve import resolve_config
    from trainer.interop import hf_config

    if not any(arg.split("=", 1)[0] in ("recipe", "config") for arg in request.rest):
        raise ConfigError("import needs recipe=NAME (or config=FILE): the recipe you will train "
                          "(recipe=list shows them)")
    cfg = resolve_config(request.rest)
    hf = hf_config.read_hf_config(request.paths["hf"])
    hf_config.family(hf)
    hf_config.compare_with_recipe(hf, cfg.model, cfg.name)
    return cfg


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def checked_export_step(given: Path, console) -> Path:
    """The step an export reads, checked before torch is imported (`export_step.checked_step`,
    `run_config_file`); when `given` is a checkpoint root, the line that names the step."""
    from trainer.interop.export_step import checked_step, run_config_file, step_line

    step = checked_step(given)
    run_config_file(given, step)
    line = step_line(given, step)
    if line:
        console.print(line, soft_wrap=True)  # paths whole, never cut
    return step


def run(request: Request, cfg, console) -> None:
    """The conversion itself (heavy imports here), then one summary line of figures. An
    export's step is checked against its `run.json` and its run's `config.yaml` found first,
    before torch, and the step a checkpoint root resolved to is named
    (`checked_export_step`)."""
    from rich.progress import Progress

    step = None
    if request.command == "export":
        step = checked_export_step(request.paths["checkpoint"], console)

    from trainer.interop import exporter, importer
    from trainer.interop.memory import gib

    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        if request.command == "import":
            result = importer.import_hf(request.paths["hf"], cfg, request.paths["out"], progress)
            held = result.bytes  # one save call needs the whole converted model
        else:
            shard = request.options.get("max_shard_size", exporter.hf_files.DEFAULT_SHARD_BYTES)
            result = exporter.export_hf(step, request.paths["out"], progress, shard,
                                        checked=True)
            held = result.peak_bytes
    console.print(f"{request.command}: {result.tensors} tensors, {gib(result.bytes)} -> "
                  f"{result.out} in {time.perf_counter() - started:.1f} s; peak RSS "
                  f"{gib(peak_rss_bytes())} (weights held at once: at most {gib(held)})")

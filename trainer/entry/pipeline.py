"""The one entry pipeline every script runs:

    parse -> resolve (recipe or saved config, overrides) -> validate (core and plugin rules,
    paths) -> dry run | machine check -> self-launch | run as rank

A script is a `Command`: its help text, its own `key=value` options and what one rank does.
Every user mistake anywhere in the pipeline or on a rank is a `ConfigError` turned into one
line, `error: <what and how to fix>`, and exit code 2, here and only here; a non-finite
loss is exit code 3; a collective that failed because another rank left is one line naming
that rank and exit code 1 (trainer/launch/agent.py). The parent process imports no torch until the
configuration is known to be valid, so a mistake or a wrong machine is refused in about a
second.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from plugins.protocol.errors import ConfigError, UserError
from recipes.config.io import CONFIG_FILENAME, save_config
from recipes.config.machine import check_machine, detect_machine
from recipes.config.path_rules import checkpoint_preflight, validate_paths
from recipes.config.schema import RunConfig
from recipes.registry import format_recipe_list
from recipes.resolve import ListRecipesRequested, resolve_config
from trainer.throughput import RUN_RULES

EXIT_USER_ERROR = 2
EXIT_NONFINITE = 3
# Set for self-launched ranks: the launching process already ran the checkpoint's pre-flight.
PREFLIGHT_DONE_ENV = "MCORE_RECIPES_PREFLIGHT_DONE"
HELP_ARGS = ("--help", "-h", "help")

RankFunction = Callable[[RunConfig, Path, dict[str, int]], int]


@dataclass(frozen=True)
class Option:
    """A script's own `key=N` argument (a positive whole number), beside the config overrides."""

    default: int
    help: str


@dataclass(frozen=True)
class Command:
    """One entry point: what `--help` says, its own options, and what each rank runs."""

    script: Path  # the script the pipeline re-launches on local ranks
    help: str  # the script's docstring: usage and examples
    run_rank: RankFunction  # (config, run dir, options) -> exit code, on every rank
    options: dict[str, Option] = field(default_factory=dict)
    # Checks the options together before anything starts (raises ConfigError); None: no check.
    check_options: Callable[[dict[str, int]], None] | None = None
    local: Callable[[list[str]], int] | None = None  # runs here instead, starting no ranks


def quiet_library_noise() -> None:
    """Library import warnings, repeated by every rank, would bury the run's own output.

    Call before Megatron is imported: most of these fire at import time.
    """
    warnings.filterwarnings("ignore", module=r"megatron\..*")
    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint\..*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("megatron", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)


def help_text(command: Command) -> str:
    """The script's usage, its own options, then every recipe with a line each."""
    lines = [command.help.strip(), ""]
    if command.options:
        lines.append("options:")
        lines += [f"  {key}=N  {opt.help} (default {opt.default})"
                  for key, opt in command.options.items()]
        lines.append("")
    return "\n".join(lines) + "\n" + format_recipe_list()


def split_options(command: Command, argv: Sequence[str]) -> tuple[dict[str, int], list[str]]:
    """The command's own `key=N` options, and the rest (recipe/config and overrides)."""
    values = {key: option.default for key, option in command.options.items()}
    rest = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in command.options:
            rest.append(arg)
            continue
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{key}={value} must be a positive whole number, e.g. {key}="
                              f"{command.options[key].default}")
        values[key] = int(value)
    return values, rest


def under_launcher() -> bool:
    """True inside a rank started by torchrun, Slurm+torchrun or our own self-launch."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def choose_run_dir(cfg: RunConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    # Every rank of an external launch must agree on the directory: use the launcher's run id.
    suffix = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output_dir) / f"{cfg.name}-{suffix}"


def prepare_run_dir(cfg: RunConfig) -> tuple[RunConfig, Path]:
    """Create the run directory and save the resolved config there.

    The saved file leaves `run_dir` unset, so `config=<that file>` reproduces the run into a
    new directory; the ranks of this run get the directory as an explicit override.
    """
    run_dir = choose_run_dir(cfg).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("RANK", "0") == "0":
        save_config(dataclasses.replace(cfg, run_dir=None), run_dir / CONFIG_FILENAME)
    return dataclasses.replace(cfg, run_dir=str(run_dir)), run_dir


def self_launch(command: Command, cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> int:
    """Start one local process per rank, each re-entering this pipeline as a rank."""
    from trainer.launch.local import launch_local_ranks

    world = cfg.layout.world_size
    print(f"launching {world} local ranks; outputs in {run_dir}", flush=True)
    args = [f"config={run_dir / CONFIG_FILENAME}", f"run_dir={run_dir}",
            *(f"{key}={value}" for key, value in options.items())]
    environment = {**cfg.plugins.launch_environment(), PREFLIGHT_DONE_ENV: "1"}
    return launch_local_ranks(world, command.script, args, environment)


def preflight(cfg: RunConfig, machine) -> None:
    """Once per run (in the launching process, or on rank 0 of an outside launch): the plan's
    summary, or a one-line refusal of a layout that cannot fit (recipes/plan/fit.py); then the
    loaded checkpoint's checks, and what a resume continues from and changes."""
    if os.environ.get(PREFLIGHT_DONE_ENV) or os.environ.get("RANK", "0") != "0":
        return
    from recipes.plan.fit import check_fits, summary_line

    on_cpu = cfg.plugins.runs_ranks_on_cpu(machine.gpus, cfg.cluster.nodes)
    print(summary_line(check_fits(cfg, attention="explicit" if on_cpu else None)), flush=True)
    for line in checkpoint_preflight(cfg):
        print(f"resume: {line}", flush=True)


def run_as_rank(command: Command, cfg: RunConfig, run_dir: Path, options: dict[str, int]) -> int:
    """This process is one rank: run the command, then tear the process groups down.

    Any other failure is reported to the run's store first (trainer/launch/agent.py): a collective
    that failed because another rank left ends in one line naming that rank and exit code 1;
    this rank's own failure keeps its traceback, and its reason reaches the other ranks."""
    from trainer.launch.agent import report_failure
    from trainer.loop import NonFiniteError

    peer_lost = False
    try:
        return command.run_rank(cfg, run_dir, options)
    except NonFiniteError as error:
        _print_once(f"error: {error}")
        return EXIT_NONFINITE
    except UserError:
        raise
    except Exception as error:
        code = report_failure(error)
        if code is None:
            raise
        peer_lost = True
        return code
    finally:
        if not peer_lost:  # tearing groups down with a rank gone can block (NCCL): just exit
            _shutdown()


def run_pipeline(command: Command, argv: Sequence[str]) -> int:
    if any(arg in HELP_ARGS for arg in argv):
        print(help_text(command))
        return 0
    options, rest = split_options(command, argv)
    if command.check_options is not None:
        command.check_options(options)
    try:
        if command.local is not None:  # e.g. the planner: resolves its own config, no ranks
            return command.local(rest)
        cfg = resolve_config(rest, check_paths=False, rules=RUN_RULES)
    except ListRecipesRequested:
        print(help_text(command))
        return 0
    if cfg.dry_run:
        from trainer.tools.dry_run import run_dry_run

        run_dry_run(cfg)
        return 0
    if not under_launcher():  # ranks of an outside launch must not race to prepare data
        from data_prep.blend_prepare import prepare_missing_data

        prepare_missing_data(cfg)
    validate_paths(cfg)
    machine = detect_machine()
    check_machine(cfg, machine, rest)
    preflight(cfg, machine)
    cfg, run_dir = prepare_run_dir(cfg)
    if under_launcher():
        return run_as_rank(command, cfg, run_dir, options)
    return self_launch(command, cfg, run_dir, options)


def main(command: Command, argv: Sequence[str] | None = None) -> int:
    """A script's whole life: the pipeline, with every user mistake as one line and exit 2."""
    quiet_library_noise()
    try:
        return run_pipeline(command, sys.argv[1:] if argv is None else argv)
    except UserError as error:  # ConfigError, and plugins' run-time refusals
        _print_once(f"error: {error}")
        return EXIT_USER_ERROR


def _print_once(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


def _shutdown() -> None:
    if "torch" not in sys.modules:
        return
    import torch
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

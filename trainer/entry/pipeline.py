"""The training pipeline behind every command that trains (pretrain, the step and checkpoint
benchmarks, the resume check), in two explicit paths:

    launching process   resolve (recipe or saved config, overrides; core, plugin and the
                        trainer's rules) -> dry run, or: prepare data a blend names -> paths ->
                        machine -> pre-flight (plan summary, checkpoint checks) -> run dir (its
                        lock: one run at a time) and config.yaml -> start one local rank per GPU
                        (or CPU rank) and wait;
                        pretrain: a run in phases that needs a new launch for a later phase
                        goes on with it, from the checkpoint saved at its start, until the end
    a rank              ends with its launcher -> resolve -> dry run, or: paths -> machine
                        (world size) -> pre-flight unless the launcher did it -> run dir (its
                        lock: rank 0 of an outside launch) -> the command's rank function ->
                        process groups torn down

The launching process says every mistake it finds before launch, one line each (the values
refused and the path problems together), and, when Ctrl-C or SIGTERM stops the ranks, the one
line that says after which step and how to continue. A process is a rank when a launcher
started it (torchrun, Slurm + torchrun, or the launching process above): `LOCAL_RANK` and
`WORLD_SIZE` are set. The launching process imports no torch
until the configuration is valid, so a mistake or a wrong machine is refused in about a second.
On a rank, a non-finite loss ends in one line and exit code 3; a collective that failed because
another rank left ends in one line naming that rank and exit code 1 (trainer/launch/agent.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from plugins.protocol.errors import (
    EXIT_NONFINITE,
    ConfigError,
    UserError,
    config_error,
    error_lines,
)
from recipes.config.io import CONFIG_FILENAME, save_config
from recipes.config.links import resolved
from recipes.config.machine import check_machine, detect_machine, ranks_on_cpu
from recipes.config.schema import RunConfig
from recipes.plan.fit import local_attention_cost
from recipes.resolve import resolve_config
from trainer.checkpoint.format import RUN_CHECKPOINTS, newest_checkpoint, step_of
from trainer.checkpoint.preflight import checkpoint_preflight, resumed_step, validate_paths
from trainer.entry.contract import Arguments, print_once
from trainer.run_dir import METRICS_FILE, RUN_LOCK, check_run_dir
from trainer.throughput import RUN_RULES

# Set for self-launched ranks: the launching process already ran the checkpoint's pre-flight.
PREFLIGHT_DONE_ENV = "MCORE_RECIPES_PREFLIGHT_DONE"

RankFunction = Callable[[RunConfig, Path, Arguments], int]


@dataclass(frozen=True)
class Training:
    """What a training command runs on every rank; optionally a check of its own options
    (raises ConfigError, on both paths, before anything starts), the launches one command
    line makes, each a list of extra overrides (the checkpoint benchmark runs two sizes), and
    whether a run in phases goes on with the later launches its phases need (pretrain)."""

    rank: RankFunction
    launches: Callable[[Arguments], list[list[str]]] | None = None
    check: Callable[[Arguments], None] | None = None
    phased: bool = False
    # Whether `dry_run=true` is this command's own (pretrain: build on meta, train nothing); a
    # command that measures by training refuses it rather than exit 0 having measured nothing.
    dry_runs: bool = False

    def __call__(self, args: Arguments) -> int:
        quiet_library_noise()
        launches = self.launches(args) if self.launches else [[]]
        # Asked of what the first launch trains: its extra overrides may name the recipe.
        if not self.dry_runs and (problem := dry_run_problem(args, launches[0])):
            raise ConfigError(problem)
        if self.check is not None:
            self.check(args)
        if launched_as_rank():
            return run_as_rank(self.rank, args)
        for extra in launches:
            code = launch_and_wait(args, extra, phased=self.phased)
            if code != 0:
                return code
        return 0


def dry_run_problem(args: Arguments, extra: Sequence[str] = ()) -> str | None:
    """Why `dry_run=true` (given, or in the config) is refused by a command that trains to
    measure (bench_step, validate_resume, check_megatron_parity, bench_checkpoint), or None;
    `extra`: what the command adds to the command line (bench_checkpoint: its recipe)."""
    if not resolve_config([*args.rest, *extra]).dry_run:
        return None
    return (f"dry_run=true: scripts/{args.script.name} trains to measure what it reports, and a "
            "dry run trains nothing; drop dry_run=true (scripts/pretrain.py with the same "
            "arguments and dry_run=true checks the layout without training)")


def launched_as_rank() -> bool:
    """True inside a rank started by torchrun, Slurm+torchrun or our own launching process."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def quiet_library_noise() -> None:
    """Library import warnings, repeated by every rank, would bury the run's own output.

    Call before Megatron is imported: most of these fire at import time.
    """
    warnings.filterwarnings("ignore", module=r"megatron\..*")
    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint\..*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("megatron", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)


def resolve(args: Arguments, extra: Sequence[str] = ()) -> RunConfig:
    """The run's config from the command line (`recipe=list` raises ListRecipesRequested,
    which the contract answers with the help text)."""
    return resolve_config([*args.rest, *extra], rules=RUN_RULES)


def resolve_for_launch(args: Arguments, extra: Sequence[str] = ()) -> RunConfig:
    """The launching process's config. When its values are refused, the path problems are
    looked for too and said with them, one line each: a scheduler mistake does not hide a
    typo in a blend path until the next try."""
    try:
        return resolve(args, extra)
    except ConfigError as error:
        raise with_path_problems(error, [*args.rest, *extra]) from None


def with_path_problems(error: ConfigError, argv: Sequence[str]) -> ConfigError:
    """`error` with the path problems of the config `argv` builds, unless the command line
    itself is wrong (no config to look at), it is a dry run (no files), or a blend's
    `prepare:` list would still make data the path rules would find missing."""
    from data_prep.blend_prepare import pending_preparations
    from recipes.resolve import build_config
    from trainer.checkpoint.preflight import path_problems

    try:
        cfg = build_config(argv)
        if cfg.dry_run or pending_preparations(cfg):
            return error
        found = path_problems(cfg)
    except Exception:  # noqa: BLE001 - a config the value rules refused may defeat a path rule
        return error
    return config_error([*error_lines(error), *found]) or error


def check_paths(args: Arguments) -> int:
    """`check=paths`: every path the run names, checked where this process runs (a Slurm
    job's first step, on the cluster, before any rank starts: a dry run elsewhere may not have
    seen them), each problem one line; one line when all are in place. Starts nothing."""
    import socket

    cfg = resolve_for_launch(args)
    validate_paths(cfg, resume=False)
    print(f"check=paths: every path {cfg.name} names is in place on {socket.gethostname()}",
          flush=True)
    return 0


def dry_run(cfg: RunConfig) -> int:
    from trainer.tools.dry_run import run_dry_run

    run_dry_run(cfg)
    return 0


# --- the launching process ------------------------------------------------------------------

def launch_and_wait(args: Arguments, extra: Sequence[str] = (), phased: bool = False) -> int:
    """Check everything once, then start this machine's ranks and wait for them. `phased`: a
    launch that stopped where a phase needing a new launch begins (a new sequence length or
    CP size) is followed by that phase's launch, from the checkpoint it saved there, until the
    run ends (recipes/config/phases.py)."""
    code, cfg, run_dir = launch_once(args, extra)
    started = resumed_step(cfg) if cfg is not None else None
    while phased and code == 0 and cfg is not None:
        following = next_launch(cfg, run_dir, started)
        if following is None:
            break
        started, span, overrides = following
        print(f"phase '{span.name}' starts at step {started}: launching it from "
              f"{run_dir / RUN_CHECKPOINTS} with {' '.join(overrides)}", flush=True)
        continued = dataclasses.replace(
            args, rest=(f"config={run_dir / CONFIG_FILENAME}", f"run_dir={run_dir}", *overrides))
        code, cfg, run_dir = launch_once(continued)
    return code


def next_launch(cfg: RunConfig, run_dir: Path, started: int | None):
    """After a launch of a run with relaunch phases: (the step the next launch starts from,
    its phase, its overrides), read from the run's newest checkpoint; None when the run has
    ended or has no relaunch phases."""
    from recipes.config.phases import continue_overrides, phase_spans, span_at

    if not any(phase.relaunch for phase in cfg.phases):
        return None
    newest = newest_checkpoint(run_dir / RUN_CHECKPOINTS)
    step = step_of(newest.name) if newest is not None else None
    if step is not None and step >= cfg.train.train_iters:
        return None
    if step is None or (started is not None and step <= started):
        raise UserError(f"the launch from step {started or 0} left no later checkpoint in "
                        f"{run_dir / RUN_CHECKPOINTS} to continue its phases from; continue "
                        f"with config={run_dir / CONFIG_FILENAME} run_dir={run_dir} "
                        "checkpoint.resume=true")
    span = span_at(phase_spans(cfg), step)
    return step, span, continue_overrides(span)


def launch_once(args: Arguments, extra: Sequence[str] = ()) -> tuple[int, RunConfig | None,
                                                                    Path | None]:
    """One launch: resolve, check, start the ranks; the exit code, config and run directory
    (no config for a dry run). A resumed run in phases launches in the layout of the phase
    its checkpoint is in: the phase comes from the saved state."""
    cfg = resolve_for_launch(args, extra)
    if cfg.dry_run:
        return dry_run(cfg), None, None
    cfg, run_dir, on_gpu = ready_to_launch(cfg, args, extra)
    return start_local_ranks(cfg, run_dir, args, on_gpu), cfg, run_dir


def ready_to_launch(cfg: RunConfig, args: Arguments,
                    extra: Sequence[str] = ()) -> tuple[RunConfig, Path, bool]:
    """Everything the launching process does before it starts ranks: prepare the data a blend
    names, check the paths and this machine, the pre-flight, the run directory with its
    config.yaml. The config the ranks start from, its directory and whether they use GPUs."""
    from data_prep.blend_prepare import prepare_missing_data

    lock_existing_run_dir(cfg)
    prepare_missing_data(cfg)  # before the path rules: they check the prepared files
    validate_paths(cfg)
    cfg = in_resumed_phase_layout(cfg, args, extra)
    machine = detect_machine()
    check_machine(cfg, machine, [*args.rest, *extra], local_attention_cost)
    preflight(cfg, machine)
    cfg, run_dir = prepare_run_dir(cfg, lock=True)
    return cfg, run_dir, not ranks_on_cpu(cfg.cluster, machine.gpus)


def lock_existing_run_dir(cfg: RunConfig) -> None:
    """Take the run's lock before any check or data preparation when its directory exists
    already (only then can another run hold it): a run refused for a directory in use is
    refused at once, before the plan's lines. `prepare_run_dir` takes it otherwise."""
    run_dir = resolved(choose_run_dir(cfg))
    if run_dir.is_dir():
        hold_run_lock(run_dir)


def in_resumed_phase_layout(cfg: RunConfig, args: Arguments, extra: Sequence[str]) -> RunConfig:
    """`cfg`, or when the step it resumes from lies in a phase of another sequence length or
    CP size, `cfg` resolved again with that phase's layout (said in one line)."""
    from recipes.config.phases import launch_layout

    start = resumed_step(cfg)
    layout = launch_layout(cfg, start)
    if not layout:
        return cfg
    print(f"resume: step {start} lies in a phase that trains with {' '.join(layout)}; this "
          "launch uses them", flush=True)
    cfg = resolve(args, [*extra, *layout])
    validate_paths(cfg)
    return cfg


def start_local_ranks(cfg: RunConfig, run_dir: Path, args: Arguments, on_gpu: bool) -> int:
    """One local process per rank, each starting this script again as a rank from the saved
    config, with the command's options (and on GPUs the environment they need)."""
    from trainer.launch.environment import cpu_environment, gpu_environment
    from trainer.launch.local import launch_local_ranks

    world = cfg.layout.world_size
    print(f"launching {world} local ranks; outputs in {run_dir}", flush=True)
    environment = {**(gpu_environment(cfg) if on_gpu else cpu_environment(cfg)),
                   PREFLIGHT_DONE_ENV: "1"}
    code = launch_local_ranks(world, args.script, rank_arguments(run_dir, args), environment)
    if code - 128 in STOP_SIGNALS:
        print(stopped_line(run_dir, cfg, signal.Signals(code - 128)), file=sys.stderr,
              flush=True)
        if finished_run(_records(run_dir), cfg):  # the signal came too late to stop it
            return 0
    return code


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SIGNAL_WORDS = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


def _records(run_dir: Path) -> list[dict]:
    import json

    path = run_dir / METRICS_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:  # a line a killed rank left half written
            continue
    return records


def stopped_line(run_dir: Path, cfg: RunConfig, signum: signal.Signals) -> str:
    """The one line a stopped run ends with: which signal, after which step (the ranks' own
    record of their stop, else the last step logged, "or a later one"), the checkpoint to
    continue from and the command that continues; or, when the ranks finished the run anyway,
    that it is complete."""
    records = _records(run_dir)
    if finished_run(records, cfg):
        return (f"{SIGNAL_WORDS[signum]} came after the last step began: the run is complete "
                f"(step {cfg.train.train_iters} of {cfg.train.train_iters}, its summary in "
                f"{run_dir / METRICS_FILE}); nothing to continue")
    stop = next((r for r in reversed(records) if r.get("kind") == "stopped"), None)
    steps = [r["step"] for r in records if r.get("kind") == "train"]
    step = stop["step"] if stop else (steps[-1] if steps else 0)
    newest = newest_checkpoint(run_dir / RUN_CHECKPOINTS)
    if stop and stop.get("checkpoint"):
        where = f"saved {stop['checkpoint']} at the stop"
    elif newest is not None:
        where = (f"the newest checkpoint is {newest} (checkpoint.save_on_stop=true saves one "
                 "at a stop)")
    else:
        where = ("no checkpoint was saved (checkpoint.save_interval=N, or "
                 "checkpoint.save_on_stop=true at a stop)")
    resume = (f"; continue with: python scripts/pretrain.py config={run_dir / CONFIG_FILENAME} "
              f"run_dir={run_dir} checkpoint.resume=true" if newest is not None else "")
    # Without the ranks' record the step is the last one logged: figures are summed and
    # recorded at the log interval, so up to log_interval - 1 later steps may have run.
    total = cfg.train.train_iters
    if stop:
        when = f"after step {step} of {total}"
    elif steps:
        when = (f"after step {step} of {total} (the last logged; up to "
                f"{cfg.logging.log_interval - 1} later steps may have run)")
    else:
        when = f"before any of its {total} steps was logged"
    return f"stopped by {SIGNAL_WORDS[signum]} {when}; every rank ended; {where}{resume}"


def finished_run(records: list[dict], cfg: RunConfig) -> bool:
    """Whether the ranks finished the run despite the signal (it came after the last step
    began): they trained its last step and wrote its summary."""
    steps = [r["step"] for r in records if r.get("kind") == "train"]
    summary = any(r.get("kind") == "summary" for r in records)
    return summary and bool(steps) and steps[-1] >= cfg.train.train_iters


def rank_arguments(run_dir: Path, args: Arguments) -> list[str]:
    """A self-launched rank's command line: the run's saved config, its directory, and the
    command's options and flags."""
    options = [f"{key}={value}" for key, value in args.options.items() if value is not None]
    return [f"config={run_dir / CONFIG_FILENAME}", f"run_dir={run_dir}", *options,
            *sorted(args.flags)]


def preflight(cfg: RunConfig, machine) -> None:
    """Once per run: the plan's summary, or a one-line refusal of a layout that cannot fit
    (recipes/plan/fit.py; CPU ranks against their share of this machine's memory); then the
    loaded checkpoint's checks, and what a resume continues from and changes."""
    from recipes.config.machine import host_memory_bytes
    from recipes.config.schema import uses_transformer_engine
    from recipes.plan.fit import check_fits, cpu_rank_cluster, local_attention_note, summary_line

    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    local_on_gpu = not on_cpu and not uses_transformer_engine(cfg.model.transformer_impl, True)
    explicit = on_cpu or local_on_gpu  # the local attention keeps the n x n scores
    cluster, memory_of = cpu_rank_cluster(cfg, host_memory_bytes()) if on_cpu else (None, None)
    plan = check_fits(cfg, cluster, attention="explicit" if explicit else None,
                      memory_of=memory_of)
    check_phase_fits(cfg, cluster, "explicit" if explicit else None, memory_of)
    print(summary_line(plan, memory_of), flush=True)
    for line in plan.warnings:  # TP or CP groups across nodes
        print(line, flush=True)
    if local_on_gpu:
        print(local_attention_note(cfg), flush=True)
    from recipes.plan.fast_paths import fast_path_line

    fast = fast_path_line(cfg, plan.attention, plan.worst.stage, on_gpu=not on_cpu)
    if not fast.endswith("none beyond the fusions"):
        print(fast, flush=True)
    for line in checkpoint_preflight(cfg):
        print(f"resume: {line}", flush=True)


def check_phase_fits(cfg: RunConfig, cluster, attention: str | None,
                     memory_of: str | None) -> None:
    """A run in phases fits when each launch it has left does (this one's layout is checked
    already): a later phase whose layout cannot fit is refused before the first rank starts,
    not at its relaunch (`recipes.plan.fit.phase_fit_problems`)."""
    from recipes.plan.fit import phase_fit_problems

    problems = phase_fit_problems(cfg, cluster, attention=attention, memory_of=memory_of,
                                  from_step=resumed_step(cfg))
    if problems:
        raise ConfigError(problems[0])


def choose_run_dir(cfg: RunConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    # Every rank of an external launch must agree on the directory: use the launcher's run id.
    suffix = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output_dir) / f"{cfg.name}-{suffix}"


def prepare_run_dir(cfg: RunConfig, lock: bool = False) -> tuple[RunConfig, Path]:
    """Create the run directory and save the resolved config there; with `lock`, first take
    the run's lock (`hold_run_lock`), so that a refused run leaves the config.yaml of the run
    it is refused for as it was.

    The saved file leaves `run_dir` unset, so `config=<that file>` reproduces the run into a
    new directory; the ranks of this run get the directory as an explicit override.
    """
    run_dir = resolved(choose_run_dir(cfg))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # checked before launch; a rank of an outside launch meets it here
        raise ConfigError(f"the run directory {run_dir} cannot be created ({err.strerror}); "
                          "set output_dir or run_dir to a writable directory") from None
    check_run_dir(run_dir)
    if lock:
        hold_run_lock(run_dir)
    if os.environ.get("RANK", "0") == "0":
        save_config(dataclasses.replace(cfg, run_dir=None), run_dir / CONFIG_FILENAME)
    return dataclasses.replace(cfg, run_dir=str(run_dir)), run_dir


_held_locks: dict[Path, object] = {}  # lock file -> its open handle, for the whole process


def hold_run_lock(run_dir: Path) -> None:
    """Let one run at a time use `run_dir` (and its checkpoint root, when a link puts it
    elsewhere): a second run's clean-up of unfinished saves (trainer/checkpoint/publish.py)
    would delete the first one's save in progress. Held by the process that lives as long as
    the ranks, until it exits: the OS releases the lock of a dead holder, so a resume after a
    crash or a requeued job is not refused by the file it left. A UserError (one line, exit 2)
    names the directory and the holder's pid."""
    roots = [run_dir]
    checkpoints = run_dir / RUN_CHECKPOINTS
    if checkpoints.is_dir() and resolved(checkpoints) != checkpoints.absolute():
        roots.append(resolved(checkpoints))
    for root in roots:
        take_lock(root / RUN_LOCK, run_dir)


def take_lock(path: Path, run_dir: Path) -> None:
    """An exclusive, non-blocking POSIX (fcntl) lock on `path`, kept open in this process; our
    pid is written in it for the refusal of the next one. POSIX locks, unlike flock's, are not
    inherited by forked children (an orphan cannot keep the run's directory) and work on NFS.
    A file system without locks is said in one line and not refused."""
    import errno
    import fcntl

    if path in _held_locks:  # this process holds it already (the next phase's launch)
        return
    handle = open(path, "a+")  # noqa: SIM115 - open for the life of this process
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = _lock_holder(handle)
        handle.close()
        if error.errno not in (errno.EACCES, errno.EAGAIN):
            print(f"note: {path} cannot be locked ({error.strerror}); nothing stops another "
                  f"run from using {run_dir} at the same time", flush=True)
            return
        raise UserError(
            f"the run directory {run_dir} is in use by another run (pid {holder} holds "
            f"{path}); wait for that run to end, or give this one another run_dir=") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _held_locks[path] = handle


def _lock_holder(handle) -> str:
    """The pid the lock's holder wrote in its file ('unknown' while it has not yet)."""
    handle.seek(0)
    text = handle.read().strip()
    return text if text.isdigit() else "unknown"


# --- a rank ---------------------------------------------------------------------------------

def run_as_rank(rank: RankFunction, args: Arguments) -> int:
    """This process is one rank of a run: check what a rank must, then run the command's rank
    function and tear the process groups down."""
    end_with_launcher()
    cfg = resolve(args)
    if cfg.dry_run:
        return dry_run(cfg)
    validate_paths(cfg)
    machine = detect_machine()
    outside_rank0 = not os.environ.get(PREFLIGHT_DONE_ENV) and os.environ.get("RANK", "0") == "0"
    check_machine(cfg, machine, list(args.rest), local_attention_cost)
    if outside_rank0:
        preflight(cfg, machine)  # an outside launch (torchrun, Slurm): rank 0 does it once
    # An outside launch has no launching process of ours to hold the run's lock: rank 0 does.
    cfg, run_dir = prepare_run_dir(cfg, lock=outside_rank0)
    return run_rank_function(rank, cfg, run_dir, args)


def end_with_launcher() -> None:
    """A rank that torch's launcher started (ours, torchrun, Slurm + torchrun: it is the
    rank's parent each time) ends with SIGKILL when that launcher dies: torch starts ranks in
    a session of their own, so a launcher killed with SIGKILL or by the OOM killer would leave
    them training and publishing checkpoints. SIGKILL, not SIGTERM: a stop at a step boundary
    could wait forever on a store the dead launcher hosted. A process given LOCAL_RANK by
    anything else stays in its launcher's session and is left alone."""
    from trainer.launch.local import LAUNCHER_PID_ENV
    from trainer.parent_watch import end_with_parent

    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    end_with_parent(int(launcher) if launcher.isdigit() else None, signal.SIGKILL)


def run_rank_function(rank: RankFunction, cfg: RunConfig, run_dir: Path,
                      args: Arguments) -> int:
    """Run the command on this rank, then tear the process groups down.

    Any other failure is reported to the run's store first (trainer/launch/agent.py): a
    collective that failed because another rank left ends in one line naming that rank and exit
    code 1; this rank's own failure keeps its traceback, and its reason reaches the other ranks.
    """
    from trainer.launch.agent import report_failure
    from trainer.loop import NonFiniteError

    peer_lost = False
    try:
        return rank(cfg, run_dir, args)
    except NonFiniteError as error:
        print_once(f"error: {error}")
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


def _shutdown() -> None:
    if "torch" not in sys.modules:
        return
    import torch
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

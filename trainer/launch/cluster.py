"""`scripts/launch.py`: a recipe as a NeMo-Run experiment on a Slurm cluster or this machine.

The ecosystem's launcher does the launching: `nemo_run.SlurmExecutor` with its torchrun
launcher renders an sbatch script that starts one torchrun per node (`--ntasks-per-node=1`,
`--nnodes`, `--nproc-per-node`, `--node-rank $SLURM_NODEID`), a c10d rendezvous on the first
node of the allocation (`$head_node_ip`, found by `scontrol show hostnames`, never a host named
here) and `sbatch --requeue`; `nemo_run.LocalExecutor` runs torchrun on this machine. Each
torchrun starts `scripts/pretrain.py` ranks, which run as the ranks torchrun gave them.

What is checked here, before anything is submitted, every mistake said in one line of its own:
the recipe and overrides (as pretrain.py resolves them), the cluster file
(`recipes/plan/cluster.py`, with the site settings a launch takes from it: account, partition,
time, container image and mounts), that the recipe's ranks fill whole nodes of the cluster and
that the cluster has that many nodes, and the paths (a dry run leaves those this machine does
not have to the job's first step, `pretrain.py check=paths`, which every job runs on the
cluster before its ranks start). In a container the job runs the image's Python with what the
run needs mounted (`job_paths.py`). nemo_run is imported only inside functions: the rest of
the project works without the `launch` extra.

What a Slurm job fixes at launch, because `scontrol requeue` reruns the same script with the
same arguments: the run directory (on shared storage, `<job_dir>/runs/<recipe>-<UTC time>`)
and `checkpoint.resume=true`, so every requeue continues the run from its newest checkpoint
instead of starting a new one; and the c10d rendezvous port, derived from the experiment name
and the launch time (NeMo-Run's fixed 29500 would collide between jobs sharing a first node).
NeMo-Run starts the command `torchrun` by name, so `scripts/agent` goes first on PATH: our
torchrun agent (a torchrun-compatible wrapper that names rendezvous timeouts and dead ranks).

A run in phases whose later phases need a new launch (a new sequence length or CP size,
recipes/config/phases.py) is one experiment of dependent jobs, one per launch, each in its
phase's layout and the run directory pinned for all: `experiment.add(..., dependencies=[the
job before])`, which NeMo-Run submits on Slurm as `sbatch --dependency=afterok:<job id>` and
runs one after the other on this machine. Each job after the first resumes the run's newest
checkpoint; a requeue of any job continues its phase (a job requeued after its last save trains
nothing and ends, trainer/loop.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import shutil
import sys
import zlib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError, UserError, config_error, error_lines
from recipes.config.arguments import with_replaced
from recipes.config.links import resolved
from trainer.launch.agent import FAILED_ATTEMPTS_ENV, SIGNALLED_EXIT
from trainer.launch.environment import gpu_environment, shell_exports

REPO = Path(__file__).resolve().parents[2]
EXECUTORS = ("slurm", "local")
TEXT_OPTIONS = ("account", "partition", "time", "job_dir", "container_image", "container_mounts",
                "container_python")
SITE_SETTINGS = ("account", "partition", "time", "container_image")  # also in a cluster file
DEFAULT_TIME = "04:00:00"
CONTAINER_PYTHON = "python3"  # the image's own, found on its PATH
AGENT_DIR = REPO / "scripts" / "agent"  # our `torchrun` agent, first on the jobs' PATH
PORT_LIMITS = (1024, 65535)  # rdzv_port=N: no privileged ports
DEFAULT_PORTS = range(20000, 30000)  # the derived default rendezvous port lies here


@dataclass
class LaunchArgs:
    cluster: str | None = None
    executor: str = "slurm"
    dry_run: bool = False
    retries: int = 0  # times Slurm requeues the job after a failure
    rdzv_port: int | None = None  # c10d rendezvous port (None: derived at launch)
    text: dict[str, str] = field(default_factory=dict)  # account, partition, time, ...
    rest: list[str] = field(default_factory=list)  # recipe/config and overrides
    given: frozenset[str] = frozenset()  # the options typed (at their default values too)


def _job_path(path: str) -> str:
    """The cluster file as the job sees it: relative to the checkout the job runs in when it
    lies inside it (the checkout is linked into the job), else absolute."""
    resolved_path = resolved(path)
    try:
        return str(resolved_path.relative_to(REPO))
    except ValueError:
        return str(resolved_path)


def check_port(key: str, value: int | None) -> str | None:
    """`rdzv_port=N`: a port number, no privileged one (the option's check)."""
    low, high = PORT_LIMITS
    if value is None or low <= value <= high:
        return None
    return (f"{key}={value} must be a port number from {low} to {high}, e.g. rdzv_port=23456, "
            "or leave it out for one derived from the experiment name and launch time")


DRY_RUN_FLAGS = ("--dry-run", "--dry_run")


def launch_args(options: Mapping[str, Any], flags: Set[str], rest: Sequence[str],
                given: Set[str] = frozenset()) -> LaunchArgs:
    """The launch a parsed command line asks for (options as LAUNCH declares them in
    trainer/entry/commands.py, `given` those typed; the rest is the recipe and its
    overrides)."""
    return LaunchArgs(
        cluster=options.get("cluster"), executor=options.get("executor") or "slurm",
        dry_run=bool(set(flags) & set(DRY_RUN_FLAGS)), retries=options.get("retries") or 0,
        rdzv_port=options.get("rdzv_port"),
        text={key: options[key] for key in TEXT_OPTIONS if options.get(key) is not None},
        rest=list(rest), given=frozenset(given))


@dataclass(frozen=True)
class LaunchPlan:
    """What one launch runs: the resolved config on the cluster's nodes, and pretrain's args."""

    cfg: Any  # the RunConfig, with cluster.nodes x gpus_per_node on the cluster's nodes
    nodes: int
    gpus_per_node: int
    script_args: list[str]
    rdzv_port: int | None = None  # set for Slurm by `pin_slurm_run`
    cluster: Any = None  # the cluster file's ClusterSpec (device, cpus_per_task, exclusive)
    run_dir: str | None = None  # the job's run directory, pinned at launch


def _resolved(rest: Sequence[str], problems: list[str]) -> Any:
    """The config the command line builds (None when the command line itself is wrong), its
    every broken value rule added to `problems`."""
    from recipes.config.validation import rule_problems
    from recipes.resolve import build_config
    from trainer.throughput import RUN_RULES

    try:
        cfg = build_config(rest)
    except ConfigError as error:
        problems += error_lines(error)
        return None
    problems += rule_problems(cfg, RUN_RULES)
    return cfg


def cluster_dir_problem(value: str | None) -> str | None:
    """`cluster=` names a folder (`cluster=conf/cluster`, a tab completion cut short): the
    loader would say "does not exist", which sends the user looking for a missing path; say
    what it is and name a file in it."""
    if value is None or not Path(value).is_dir():
        return None
    files = sorted(Path(value).glob("*.yaml"))
    example = f"cluster={files[0]}" if files else "cluster=conf/cluster/h100_80gb_8x8.yaml"
    return f"cluster={value} is a directory; name a cluster file in it, e.g. {example}"


def _cluster(args: LaunchArgs, problems: list[str]) -> Any:
    if args.cluster is None:
        problems.append("cluster= is missing; name a cluster file, e.g. "
                        "cluster=conf/cluster/h100_80gb_8x8.yaml")
        return None
    problem = cluster_dir_problem(args.cluster)
    if problem:
        problems.append(problem)
        return None
    from recipes.plan.cluster import load_cluster

    try:
        return load_cluster(args.cluster)
    except ConfigError as error:
        problems += error_lines(error)
        return None


def job_dir_problem(value: str | None, repo: Path = REPO) -> str | None:
    """`job_dir` lies outside this checkout: NeMo-Run packages the code from the git work tree
    and mangles job paths inside it (and a job's logs would land among the sources)."""
    if value is None or not resolved(value).is_relative_to(repo):
        return None
    return (f"job_dir={value} is inside this checkout ({repo}); NeMo-Run mangles job paths in a "
            "git work tree: use a directory outside it, e.g. job_dir=/shared/jobs")


def job_dir_writable_problem(value: str | None) -> str | None:
    """`job_dir` can be created and written here, tried before anything is submitted (the
    path rules' own test, which leaves nothing behind): NeMo-Run creates it first thing, and an
    unwritable one (`/proc/jobs`) otherwise ends in its `os.makedirs` traceback."""
    from recipes.config.path_rules import directory_problem

    if value is None:
        return None
    return directory_problem("job_dir", value, "set job_dir to a writable directory on the "
                             "cluster's shared storage, e.g. job_dir=/shared/jobs")


def pretrain_dry_run_problem(cfg: Any) -> str | None:
    """`dry_run=true` is pretrain.py's config field (a layout's dry run on one CPU, no
    training), not launch.py's "print the job, do not submit" (`--dry-run`): passed on, it
    would submit a real job that builds the layout and trains nothing."""
    if cfg is None or not getattr(cfg, "dry_run", False):
        return None
    return ("dry_run=true is pretrain.py's dry run of a layout on one CPU, not launch.py's; to "
            "print the job without submitting use --dry-run (drop dry_run=true)")


SLURM_ONLY = ("account", "partition", "time", "retries", "rdzv_port", "container_mounts",
              "container_python")


def _typed(args: LaunchArgs, key: str) -> bool:
    """Whether the command line set `key` (typed at its default too, as `retries=0`)."""
    if key in args.given or key in args.text:
        return True
    return bool(args.retries) if key == "retries" else key == "rdzv_port" and (
        args.rdzv_port is not None)


def slurm_only_problem(args: LaunchArgs) -> str | None:
    """Options that only a Slurm job uses, given with executor=local: they would be ignored
    without a word, and the user believes the run has an account, a time limit or retries."""
    if args.executor != "local":
        return None
    given = [f"{key}=" for key in SLURM_ONLY if _typed(args, key)]
    if not given:
        return None
    return (f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to Slurm jobs "
            "only; executor=local runs here and would ignore "
            f"{'it' if len(given) == 1 else 'them'}: drop {'it' if len(given) == 1 else 'them'}"
            " or use executor=slurm")


def _digits(text: str) -> bool:
    return re.fullmatch(r"[0-9]+", text) is not None


def time_range_problem(key: str, value: str | None) -> str | None:
    """A time limit of sbatch's forms (`recipes/plan/cluster.py` checks the form) whose fields
    are in range: minutes and seconds below 60 after the first field, hours below 24 after
    `D-`. `99:99:99` is a typo sbatch does not take as meant; said here, not by sbatch."""
    if value is None:
        return None
    days, dash, clock = str(value).strip().rpartition("-")
    parts = clock.split(":")
    if not all(_digits(part) for part in parts) or (dash and not _digits(days)):
        return None  # not sbatch's form: slurm_time_problem says so
    # D-HH[:MM[:SS]]; MM:SS; HH:MM:SS (minutes alone: any number)
    limits = (24, 60, 60) if dash else (None, 60) if len(parts) == 2 else (None, 60, 60)
    if all(limit is None or int(part) < limit for part, limit in
           zip(parts, limits, strict=False)):
        return None
    return (f"{key}={value!r} is out of range for a Slurm time limit: minutes and seconds must "
            "be below 60 (and hours below 24 after D-); write minutes, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM or D-HH:MM:SS, e.g. 04:00:00 or 1-12:00:00")


def slurm_name_problem(key: str, value: str | None) -> str | None:
    """A Slurm partition or account name holds no whitespace: sbatch refuses `a b`, which
    would otherwise be rendered quoted into the script and fail at submit."""
    if value is None or not re.search(r"\s", value):
        return None
    noun = key.rsplit(" ", 1)[-1]  # `partition`, or `<cluster file>: partition`
    return (f"{key}={value!r} holds whitespace, which no Slurm {noun} name has; write the "
            "name as sinfo or sacctmgr shows it")


def site_value_problems(args: LaunchArgs, cluster: Any) -> list[str]:
    """The Slurm site settings the job gets, the command line's or else the cluster file's:
    partition and account names, the time limit's ranges."""
    problems = []
    for key in ("partition", "account", "time"):
        value = site(args, cluster, key)
        where = key if key in args.text else f"{args.cluster}: {key}"
        check = time_range_problem if key == "time" else slurm_name_problem
        problems.append(check(where, value))
    return [problem for problem in problems if problem]


def container_python_problem(value: str | None) -> str | None:
    """`container_python` is a command the image's PATH finds (`python3`) or an absolute path
    (inside the image, or on storage a mount brings in); a relative path would be looked up
    from the job's working directory, which only the user's shell knew."""
    if value is None or "/" not in value or value.startswith("/"):
        return None
    return (f"container_python={value} is a relative path; give an absolute one (e.g. "
            "/shared/envs/train/bin/python) or a command on the image's PATH (e.g. python3)")


def site_problems(args: LaunchArgs) -> list[str]:
    """The launch's own site settings: a Slurm time limit, mounts of the pyxis form, a job
    directory outside this checkout that can be written, no Slurm option on a local run."""
    from recipes.plan.cluster import mount_problem, slurm_time_problem

    inside = job_dir_problem(args.text.get("job_dir"))
    problems = [slurm_time_problem("time", args.text.get("time")), inside,
                None if inside else job_dir_writable_problem(args.text.get("job_dir")),
                container_python_problem(args.text.get("container_python")),
                slurm_only_problem(args)]
    problems += [mount_problem("container_mounts", mount) for mount in mounts_given(args)]
    if args.executor == "local" and args.text.get("container_image"):
        problems.append("container_image= runs a Slurm job in a container (pyxis); "
                        "executor=local runs on this machine: drop one of them")
    return [problem for problem in problems if problem]


def _count(number: int, noun: str) -> str:
    """`1 node`, `2 nodes`: the lines read as written by hand."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def placement_problems(cfg: Any, cluster: Any, args: LaunchArgs) -> list[str]:
    """The recipe's ranks on the cluster file's nodes: as many nodes as it has; one node for
    the local executor."""
    nodes, gpus = cfg.cluster.nodes, cfg.cluster.gpus_per_node
    problems = []
    if nodes > cluster.nodes:
        problems.append(
            f"{cfg.name} needs {_count(nodes, 'node')} of {_count(gpus, 'GPU')} "
            f"({_count(nodes * gpus, 'rank')}) but cluster={args.cluster} has "
            f"{cluster.nodes}; pick a larger cluster file or a recipe with fewer ranks")
    if args.executor == "local" and nodes > 1:
        problems.append(
            f"executor=local runs on this machine only, but {cfg.name} needs {nodes} nodes on "
            f"cluster={args.cluster}; use executor=slurm")
    return problems


def fit_problems(cfg: Any, cluster: Any) -> list[str]:
    """A layout that cannot fit the cluster file's GPUs (or a save its nodes' CPU memory) is
    said here, as `pretrain.py` would say it on the first step of the job, so an allocation is
    never spent on it. A run in phases fits when every one of its launches does: each phase
    job's layout is checked too (`phase_fit_problems`), before the first job is submitted, not
    found out at the relaunch. CPU nodes are judged by the job itself, against the memory it
    finds."""
    from recipes.config.schema import uses_transformer_engine
    from recipes.plan.cluster import recipe_cluster
    from recipes.plan.fit import check_fits, phase_fit_problems

    if cluster.device == "cpu":
        return []
    explicit = not uses_transformer_engine(cfg.model.transformer_impl, True)
    attention, spec = "explicit" if explicit else None, recipe_cluster(cfg, network_of=cluster)
    try:
        check_fits(cfg, spec, attention=attention)
    except ConfigError as error:
        return error_lines(error)
    return phase_fit_problems(cfg, spec, attention=attention)


def launch_path_rules(absent: Sequence[Any]) -> tuple:
    """The path rules a launch runs here: all of them, but those about a path a dry run could
    not see (`job_paths.cluster_only`), which the job's first step runs on the cluster."""
    from recipes.config.path_rules import (
        check_blend_splits,
        check_cluster_spec,
        check_data_blend,
        check_phase_blends,
        check_run_dir,
    )
    from trainer.checkpoint.preflight import RUN_PATH_RULES, check_checkpoint_load_path

    fields = {named.field for named in absent}
    skipped = {check_data_blend, check_phase_blends, check_blend_splits} \
        if fields & {"data.blend", "phases"} else set()
    skipped |= {rule for field, rule in (("checkpoint.load", check_checkpoint_load_path),
                                         ("cluster.spec", check_cluster_spec),
                                         ("run_dir", check_run_dir)) if field in fields}
    return tuple(rule for rule in RUN_PATH_RULES if rule not in skipped)


def plan_launch(args: LaunchArgs) -> LaunchPlan:
    """Resolve and validate the recipe, then place its ranks on the cluster's nodes. Every
    mistake found before launch is said, one line each: the command line's values, the cluster
    file, the placement, the launch's own settings and the paths. Paths are checked on the
    placed config: the rules that depend on the layout (the built-in demo corpus beyond one
    node) judge the nodes this launch uses. A dry run leaves the paths that do not exist here
    to the job's first step on the cluster and names them in one line. `checkpoint.resume` is
    left for the job to resolve when it (re)starts."""
    from recipes.plan.cluster import apply_cluster, recipe_cluster
    from recipes.plan.fit import layout_warnings
    from trainer.checkpoint.preflight import path_problems
    from trainer.launch.job_paths import cluster_only, cluster_only_line

    problems: list[str] = []
    cfg = _resolved(args.rest, problems)
    problems += [problem for problem in (pretrain_dry_run_problem(cfg),) if problem]
    cluster = _cluster(args, problems)
    problems += site_problems(args)
    if cluster is not None and args.executor == "slurm":
        problems += site_value_problems(args, cluster)
    absent: list[Any] = []
    if cfg is not None and cluster is not None:
        try:
            cfg = apply_cluster(cfg, cluster)
        except ConfigError as error:
            problems += error_lines(error)
            cfg = None
    if cfg is not None and cluster is not None:
        problems += placement_problems(cfg, cluster, args)
        problems += fit_problems(cfg, cluster) if not problems else []
        absent = cluster_only(cfg) if args.dry_run else []
        problems += _quietly(lambda: path_problems(cfg, launch_path_rules(absent)), problems)
    error = config_error(problems)
    if error is not None:
        raise error
    if absent:
        print(cluster_only_line(absent), flush=True)
    for line in layout_warnings(cfg, recipe_cluster(cfg, network_of=cluster)):
        print(line, flush=True)  # TP or CP groups across this cluster's nodes
    nodes, gpus = cfg.cluster.nodes, cfg.cluster.gpus_per_node
    placed = [f"cluster.nodes={nodes}", f"cluster.gpus_per_node={gpus}"]
    placed.append(f"cluster.spec={_job_path(args.cluster)}")  # peak FLOP/s for MFU
    if cluster.device == "cpu" and not any(
            arg.startswith("cluster.device=") for arg in args.rest):
        placed.append("cluster.device=cpu")  # CPU nodes: ranks are processes
    return LaunchPlan(cfg, nodes, gpus, with_replaced(args.rest, placed), cluster=cluster)


def _quietly(find, known: list[str]) -> list[str]:
    """`find()`'s problems; nothing when it cannot judge a config already refused."""
    try:
        return find()
    except Exception:  # noqa: BLE001 - a refused config may defeat a path rule
        if not known:
            raise
        return []


@dataclass(frozen=True)
class PhaseJob:
    """One job of a launch: its NeMo-Run task name, the phase it starts in (None: the run's
    only job) and the overrides it adds to the run's arguments."""

    name: str
    phase: str | None = None
    extra: tuple[str, ...] = ()


def phase_jobs(cfg: Any) -> list[PhaseJob]:
    """One job per launch the run's phases need: the first in the first phase's layout, each
    later one the full resume in its phase's layout (recipes/config/phases.py)."""
    from recipes.config.phases import (
        continue_overrides,
        launch_starts,
        phase_spans,
        relaunch_overrides,
    )

    starts = launch_starts(phase_spans(cfg))
    if len(starts) == 1:
        return [PhaseJob("pretrain")]
    return [PhaseJob(f"pretrain-{re.sub(r'[^A-Za-z0-9_-]+', '-', span.name)}", span.name, tuple(
        relaunch_overrides(span) if index == 0 else continue_overrides(span)))
        for index, span in enumerate(starts)]


def _require_nemo_run() -> None:
    if importlib.util.find_spec("nemo_run") is None:
        raise ConfigError("scripts/launch.py needs NeMo-Run, which is not installed; install "
                          "it with `pip install -e '.[launch]'`")


def job_dir(args: LaunchArgs) -> str:
    """Where NeMo-Run keeps the experiment and the job's scripts and logs (shared storage;
    outside this checkout: NeMo-Run mangles job paths inside a git work tree). Default:
    NeMo-Run's own home (`$NEMORUN_HOME`, else ~/.nemo_run)."""
    from nemo_run.config import get_nemorun_home

    return str(resolved(args.text.get("job_dir") or get_nemorun_home()))


def default_rdzv_port(experiment: str, now: datetime) -> int:
    """A port in `DEFAULT_PORTS` from a CRC-32 of the experiment name and the launch time (to
    the microsecond): two jobs whose first nodes coincide rarely pick the same one."""
    digest = zlib.crc32(f"{experiment}@{now.isoformat()}".encode())
    return DEFAULT_PORTS[digest % len(DEFAULT_PORTS)]


def _claim(path: Path) -> bool:
    """Create `path` for this launch; False when another launch has it already."""
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return False
    except OSError as err:
        raise ConfigError(f"job_dir={path.parent.parent}: cannot create the run directory {path} "
                          f"({err.strerror}); set job_dir to a writable shared directory") from None
    return True


def new_run_dir(base: Path, create: bool) -> Path:
    """`base`, or `base-2`, `base-3`, ... when a launch in the same second took it: created
    now when submitting (so no later launch takes it too), only named for a dry run."""
    for attempt in range(1, 100):
        path = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        if _claim(path) if create else not path.exists():
            return path
    raise ConfigError(f"{base} and {base.name}-2 ... -99 exist; pass run_dir=<a new directory>")


def requeue_args(cfg: Any, rest: Sequence[str], run_dir: Path) -> tuple[list[str], str]:
    """pretrain.py's extra arguments on Slurm, and the line that says what a requeue does: the
    run directory pinned now (unless the user named one) and `checkpoint.resume=true` (unless
    the user set `checkpoint.resume` or `checkpoint.load`, which excludes it)."""
    extra = [] if cfg.run_dir else [f"run_dir={run_dir}"]
    where = cfg.run_dir or str(run_dir)
    if cfg.checkpoint.load is not None:
        return extra, (f"run directory: {where}; a requeued job starts again from "
                       f"checkpoint.load={cfg.checkpoint.load}")
    if not any(arg.startswith("checkpoint.resume=") for arg in rest):
        extra.append("checkpoint.resume=true")
    elif not cfg.checkpoint.resume:
        return extra, f"run directory: {where}; a requeued job starts again from step 0"
    return extra, f"run directory: {where} (a requeued job continues from its newest checkpoint)"


def pin_run_dir(plan: LaunchPlan, args: LaunchArgs, now: datetime) -> LaunchPlan:
    """The run directory on the jobs' storage and `checkpoint.resume=true`, fixed at launch so
    that each requeue, and each later job of a run in phases, continues the same run."""
    base = Path(job_dir(args)) / "runs" / f"{plan.cfg.name}-{now:%Y%m%d-%H%M%S}"
    run_dir = base if plan.cfg.run_dir else new_run_dir(base, create=not args.dry_run)
    extra, line = requeue_args(plan.cfg, args.rest, run_dir)
    print(line, flush=True)
    return dataclasses.replace(plan, script_args=[*plan.script_args, *extra],
                               run_dir=str(plan.cfg.run_dir or run_dir))


def pin_slurm_run(plan: LaunchPlan, args: LaunchArgs, experiment: str,
                  now: datetime | None = None) -> LaunchPlan:
    """What a Slurm job fixes at launch so that each requeue continues the same run: the run
    directory on shared storage, `checkpoint.resume=true` and the rendezvous port (printed)."""
    now = now or datetime.now(UTC)
    plan = pin_run_dir(plan, args, now)
    port = args.rdzv_port or default_rdzv_port(experiment, now)
    print(rendezvous_line(plan.nodes, port, chosen=args.rdzv_port is not None), flush=True)
    return dataclasses.replace(plan, rdzv_port=port)


def pin_local_run(plan: LaunchPlan, args: LaunchArgs, now: datetime) -> LaunchPlan:
    """A local job's run directory, chosen once here (`<output_dir>/<recipe>-<time>`, as
    pretrain.py names a run, or the run_dir= given): each rank would otherwise name it after
    torchrun's run id (TORCHELASTIC_RUN_ID, which NeMo-Run's local torchrun sets)."""
    run_dir = Path(plan.cfg.run_dir or "")
    if not plan.cfg.run_dir:
        base = resolved(plan.cfg.output_dir) / f"{plan.cfg.name}-{now:%Y%m%d-%H%M%S}"
        run_dir = new_run_dir(base, create=not args.dry_run)
        plan = dataclasses.replace(plan, script_args=[*plan.script_args, f"run_dir={run_dir}"])
    print(f"run directory: {run_dir}", flush=True)
    return dataclasses.replace(plan, run_dir=str(run_dir))


def rendezvous_line(nodes: int, port: int, chosen: bool) -> str:
    if nodes == 1:  # NeMo-Run's torchrun then rendezvous on localhost:0, a free port
        return "rendezvous: one node, torchrun picks a free local port"
    how = "rdzv_port" if chosen else (
        f"derived from the experiment name and launch time, {DEFAULT_PORTS[0]}-"
        f"{DEFAULT_PORTS[-1]}; rdzv_port=N to choose")
    return f"rendezvous: c10d on port {port} of the job's first node ({how})"


FAILED_ATTEMPTS_FILE = "slurm_failed_attempts"  # in the run directory, one line per failure


def retry_lines(retries: int, run_dir: str | None, job: str = "pretrain") -> list[str]:
    """sbatch lines that make `retries` count failed attempts only. NeMo-Run's script requeues
    a failed attempt while `TORCHX_MAX_RETRIES > SLURM_RESTART_COUNT`, but `scontrol requeue`
    and preemption raise the restart count too; our torchrun agent records each failed attempt
    (trainer/launch/agent.py, `note_failed_attempt`), so the allowance is raised by the
    restarts that were not failures. The script also requeues an attempt whose steps alone got
    SIGTERM (`scancel --signal=TERM`: the batch shell lives on and sees the agent's exit code
    128 + 15), which is a stop, not a failure: its `scontrol requeue` is skipped (a shell
    function of that name, which the script's later `scontrol requeue` line calls). Each job of a
    run in phases counts its own."""
    if run_dir is None:
        return []
    name = FAILED_ATTEMPTS_FILE if job == "pretrain" else f"{FAILED_ATTEMPTS_FILE}-{job}"
    record = shlex.quote(str(Path(run_dir) / name))
    return [f"export {FAILED_ATTEMPTS_ENV}={record}",
            f'failed_attempts=$(sort -u {record} 2>/dev/null | wc -l)',
            f"export TORCHX_MAX_RETRIES=$(( {retries} + ${{SLURM_RESTART_COUNT:-0}} - "
            "failed_attempts ))",
            f'scontrol() {{ if [ "$1" = requeue ] && [ "${{exitcode:-0}}" -eq {SIGNALLED_EXIT} ]; '
            'then echo "not requeued: the job\'s steps got SIGTERM (scancel --signal=TERM), a '
            'stop, not a failure to retry"; return 0; fi; command scontrol "$@"; }']


def mounts_given(args: LaunchArgs) -> list[str]:
    """The user's own container mounts: `container_mounts=A,B` (pyxis's form)."""
    return [part.strip() for part in (args.text.get("container_mounts") or "").split(",")
            if part.strip()]


def site(args: LaunchArgs, cluster: Any, key: str) -> str | None:
    """A Slurm site setting: the command line's, else the cluster file's (None: neither)."""
    value = args.text.get(key)
    return value if value is not None else getattr(cluster, key, None)


@dataclass(frozen=True)
class Container:
    """How a job runs in a container: pyxis's image and mounts, the variables the job sets
    that the container must see over the image's (`--container-env`), and its Python."""

    image: str
    mounts: tuple[str, ...]
    env: tuple[str, ...]
    python: str

    def srun_flags(self, workdir: Path) -> list[str]:
        """The pyxis flags of a step of the job (NeMo-Run writes the training step's)."""
        return ["--container-image", self.image, "--container-mounts", ",".join(self.mounts),
                "--container-workdir", str(workdir),
                *(["--container-env", ",".join(self.env)] if self.env else [])]


def container_of(plan: LaunchPlan, args: LaunchArgs, exported: Sequence[str]) -> Container | None:
    """The container a Slurm job runs in (None: on the nodes' own system): the image from the
    command line or the cluster file; mounts: the cluster file's, the command line's, and what
    the run needs (trainer/launch/job_paths.py)."""
    from trainer.launch.job_paths import container_mounts

    image = site(args, plan.cluster, "container_image")
    if image is None:
        unused = [key for key in ("container_python", "container_mounts") if args.text.get(key)]
        if unused:
            raise ConfigError(f"{unused[0]}= sets up the job's container, but no "
                              "container_image is given (here or in the cluster file): give "
                              f"container_image=..., or drop {unused[0]}=")
        return None
    python = args.text.get("container_python")
    given = [*getattr(plan.cluster, "container_mounts", ()), *mounts_given(args)]
    configs = [arg.split("=", 1)[1] for arg in args.rest if arg.startswith("config=")]
    mounts = container_mounts(plan.cfg, job_dir(args), plan.run_dir, given, python,
                              files=[*configs, *([args.cluster] if args.cluster else [])])
    return Container(image, tuple(mounts), tuple(exported), python or CONTAINER_PYTHON)


def check_step(script_args: Sequence[str], container: Container | None) -> list[str]:
    """The job's first step: one task on the first node checks every path the run names, on
    the cluster and in the job's own environment (its container), before any rank starts; a
    missing one ends the job with its one line (exit 2, no requeue: a path does not come back
    by retrying)."""
    where = container.srun_flags(REPO) if container else ["--chdir", str(REPO)]
    python = container.python if container else "python"
    command = ["srun", "--nodes=1", "--ntasks=1", *where, python, "scripts/pretrain.py",
               *script_args, "check=paths"]
    return ["# every path the run names, checked on the cluster before any rank starts",
            f"{' '.join(shlex.quote(word) for word in command)} || exit 2"]


def slurm_executor(plan: LaunchPlan, args: LaunchArgs, job: PhaseJob = PhaseJob("pretrain"),
                   script_args: Sequence[str] = ()) -> Any:
    """NeMo-Run's Slurm executor: one torchrun per node, this checkout as the job's code. In a
    container the image's Python runs our torchrun agent (`agent_task`), with what the run
    needs mounted; else this environment's, first on PATH."""
    import nemo_run as run

    cluster = plan.cluster
    on_cpu = cluster is not None and cluster.device == "cpu"
    environment = gpu_environment(plan.cfg)  # GPU ranks' needs (harmless on CPU)
    retry = retry_lines(args.retries, plan.run_dir, job.name)
    exported = [*([FAILED_ATTEMPTS_ENV] if retry else []), *sorted(environment)]
    container = container_of(plan, args, exported)
    # Our torchrun agent, then torchrun and python from this environment (on the shared file
    # system too): NeMo-Run's launch line names `torchrun`, so PATH picks it. A container
    # runs the agent with its own Python instead (agent_task) and needs neither.
    path = [] if container else [f'export PATH="{AGENT_DIR}:{Path(sys.executable).parent}:$PATH"']
    executor = run.SlurmExecutor(
        account=site(args, cluster, "account"), partition=site(args, cluster, "partition"),
        time=site(args, cluster, "time") or DEFAULT_TIME, nodes=plan.nodes,
        ntasks_per_node=plan.gpus_per_node,
        gpus_per_node=None if on_cpu else plan.gpus_per_node,  # no GPU request on CPU nodes
        cpus_per_task=cluster.cpus_per_task if cluster else None,
        exclusive=True if cluster is not None and cluster.exclusive else None,
        container_image=container.image if container else None,
        container_mounts=list(container.mounts) if container else [],
        container_env=list(container.env) if container and container.env else None,
        # Where NeMo-Run lays the experiment out (Experiment(base_dir=job_dir)): the packager
        # links the code into <job_dir>/experiments/<name>/<id>/, so the tunnel must agree.
        tunnel=run.LocalTunnel(job_dir=str(Path(job_dir(args)) / "experiments")),
        job_name_prefix="mcore-",
        # The checkout is on the cluster's shared file system: link it, do not archive it.
        packager=run.GitArchivePackager(symlink_from_remote_dir=str(REPO)),
        setup_lines="\n".join([*path, *retry, *shell_exports(environment),
                               *check_step(script_args, container)]),
    )
    if container is None:  # NeMo-Run then asks one task per node; port None: its default
        port = {} if plan.rdzv_port is None else {"rdzv_port": plan.rdzv_port}
        executor.launcher = run.Torchrun(**port)
    else:
        executor.ntasks_per_node = 1  # one agent per node starts the node's ranks
    executor.retries = args.retries
    return executor, container


# Shell variables the agent's command line leaves for the batch shell to fill in.
JOB_VARIABLES = ("$head_node_ip", "$SLURM_NODEID")


def agent_arguments(plan: LaunchPlan, script_args: Sequence[str]) -> list[str]:
    """Our torchrun agent's command line for a container job: what NeMo-Run's torchrun
    launcher writes (`--rdzv-backend c10d`, the first node's address at run time, one agent
    per node; `localhost:0` on one node), then pretrain.py and its arguments, quoted."""
    one_node = plan.nodes == 1
    endpoint = "localhost:0" if one_node else f"$head_node_ip:{plan.rdzv_port}"
    words = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", str(plan.rdzv_port or 1), "--nnodes", str(plan.nodes),
             "--nproc-per-node", str(plan.gpus_per_node),
             "--node-rank", "0" if one_node else "$SLURM_NODEID", "--tee", "3",
             "scripts/pretrain.py", *script_args]
    return [word if any(word.startswith(v) for v in JOB_VARIABLES) else shlex.quote(word)
            for word in words]


def local_path(current: str) -> str:
    """PATH for the local executor: our torchrun agent first, then this interpreter's bin dir
    when it is not on PATH yet, then the rest."""
    parts = [part for part in current.split(os.pathsep) if part and part != str(AGENT_DIR)]
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in parts:
        parts.insert(0, bin_dir)
    return os.pathsep.join([str(AGENT_DIR), *parts])


def local_executor(plan: LaunchPlan) -> Any:
    """NeMo-Run's local executor (torchx's local scheduler runs `torchrun` found on PATH: our
    agent, then this interpreter's, which need not be on PATH when run as .venv/bin/python)."""
    import nemo_run as run

    os.environ["PATH"] = local_path(os.environ.get("PATH", ""))
    # NeMo-Run sets LOGLEVEL=INFO for torchrun: its startup lines would bury the ranks' output
    quiet = {"LOGLEVEL": os.environ.get("LOGLEVEL", "WARNING")}
    return run.LocalExecutor(ntasks_per_node=plan.gpus_per_node, launcher="torchrun",
                             env_vars=quiet)


def build_task(plan: LaunchPlan, args: LaunchArgs,
               job: PhaseJob = PhaseJob("pretrain")) -> tuple[Any, Any]:
    """(executor, task): pretrain.py under torchrun on every node, with the job's overrides."""
    import nemo_run as run

    script_args = [*plan.script_args, *job.extra]
    if args.executor == "slurm":  # run from the job's code dir, a link to this checkout
        executor, container = slurm_executor(plan, args, job, script_args)
        if container is not None:  # the image's Python runs our agent, which starts the ranks
            return executor, run.Script(path="scripts/agent/torchrun", entrypoint=container.python,
                                        args=agent_arguments(plan, script_args))
        return executor, run.Script(
            path="scripts/pretrain.py", args=script_args, entrypoint="python")
    return local_executor(plan), run.Script(  # runs where it is started: name the script
        path=str(REPO / "scripts" / "pretrain.py"), args=script_args, entrypoint="python")


def add_jobs(experiment: Any, plan: LaunchPlan, args: LaunchArgs,
             jobs: Sequence[PhaseJob]) -> None:
    """Each job into the experiment, each depending on the one before (a run in phases)."""
    previous: str | None = None
    for job in jobs:
        executor, task = build_task(plan, args, job)
        previous = experiment.add(task, executor=executor, name=job.name,
                                  dependencies=[previous] if previous else None)


def rendered_script(experiment: Any) -> str:
    """What the experiment would submit: each job's sbatch script (Slurm) or command (local);
    a job that waits for another says so above its script."""
    experiment.dryrun(log=False)
    names = {job.id: job.id for job in experiment.jobs}
    parts = []
    for index, job in enumerate(experiment.jobs):
        info = job._dryrun_info  # set by Job.launch(dryrun=True)
        request = info.request
        slurm = hasattr(request, "materialize")  # a SlurmBatchRequest
        if slurm:
            text = " ".join(request.launch_cmd) + " <<'SBATCH'\n" + request.materialize() + \
                "\nSBATCH"
        else:
            text = str(info)
        if len(experiment.jobs) > 1:
            after = ", ".join(names[dep] for dep in job.dependencies)
            how = " (sbatch --dependency=afterok:<its job id>)" if slurm else ""
            wait = f"; runs after {after} succeeds{how}" if after else ""
            text = f"# job {index + 1}/{len(experiment.jobs)}: {job.id}{wait}\n{text}"
        parts.append(text)
    return "\n".join(parts)


def run_launch(args: LaunchArgs) -> int:
    """Check, place and submit (or render, or run here) one launch, as one job or as a run in
    phases' dependent jobs; the scaling harness submits each of its sizes through this too
    (trainer/tools/scaling/sweep.py)."""
    plan = plan_launch(args)
    _require_nemo_run()
    import nemo_run as run

    experiment_name = f"mcore-{plan.cfg.name}"
    jobs = phase_jobs(plan.cfg)
    base = Path(job_dir(args))
    made = [*missing_parts(base / "runs"), *missing_parts(base / "experiments" / experiment_name)]
    if args.executor == "slurm":
        plan = pin_slurm_run(plan, args, experiment_name)
    elif len(jobs) > 1:  # the later jobs resume the first one's run directory
        plan = pin_run_dir(plan, args, datetime.now(UTC))
    else:
        plan = pin_local_run(plan, args, datetime.now())
    if len(jobs) > 1:
        print(f"phases: {len(jobs)} dependent jobs, "
              + ", then ".join(f"{job.name} ({' '.join(job.extra)})" for job in jobs), flush=True)
    if args.executor == "slurm" and not args.dry_run:
        if plan.run_dir and not plan.cfg.run_dir:  # pinned and created just now
            made.append(Path(plan.run_dir))
        return submit_slurm(experiment_name, plan, args, jobs, made)
    with run.Experiment(experiment_name, log_level="WARN", base_dir=str(base)) as experiment:
        add_jobs(experiment, plan, args, jobs)
        if args.dry_run:
            print(rendered_script(experiment))
        else:
            experiment.run(detach=False, tail_logs=True)  # the ranks' output, as they run
    if args.dry_run:  # NeMo-Run removes its experiment's folder, not the ones above it
        remove_empty(made)
        return 0
    states = [str(job.state) for job in experiment.jobs]  # ran here and waited: pass them on
    for job, state in zip(experiment.jobs, states, strict=True):
        print(f"{job.id} under NeMo-Run's local executor: {state}; run directory: "
              f"{plan.run_dir}; its log: {local_log(job.executor.job_dir)}", flush=True)
    return 0 if all(state.endswith("SUCCEEDED") for state in states) else 1


def local_log(job_dir: str) -> str:
    """A local job's log, all its ranks' output (NeMo-Run writes it under the job's directory
    as `nemo_run/<app id>/<role>/0/combined.log`), else the job's directory."""
    found = sorted(Path(job_dir).glob("nemo_run/*/*/*/combined.log"))
    return str(found[-1]) if found else job_dir


def missing_parts(path: Path) -> list[Path]:
    """The folders of `path` that do not exist yet, innermost first: what a launch is about
    to create there, so that it can remove exactly those again (and nothing that was there)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_empty(made: Sequence[Path]) -> None:
    """Remove the folders in `made` that are empty, innermost first: a dry run or a failed
    submit leaves no empty run or experiment folder behind (one another launch has put
    something in since stays)."""
    for path in sorted(set(made), key=lambda path: len(path.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()


def undo_failed_submit(experiment: Any, made: Sequence[Path]) -> None:
    """After a submit that submitted no job: remove the experiment's folder NeMo-Run wrote
    (its own, named by the launch time in nanoseconds) and the folders this launch created, so
    the job directory is as it was. Once any job is submitted (the first of a run in phases),
    everything stays: that job uses the run directory."""
    if experiment is not None and any(job.handle for job in experiment.jobs):
        return
    folder = getattr(experiment, "_exp_dir", None)
    if folder and Path(folder).is_dir():
        shutil.rmtree(folder, ignore_errors=True)  # links (the code) are removed, not followed
    remove_empty([*made, *([Path(folder)] if folder else [])])


def submit_slurm(name: str, plan: LaunchPlan, args: LaunchArgs, jobs: Sequence[PhaseJob],
                 made: Sequence[Path] = ()) -> int:
    """Submit through NeMo-Run and say which jobs they are and their states. A failed submit
    is one line (no sbatch here, a controller out of reach, or Slurm's own reason; NeMo-Run's
    report of it and its traceback are held back) and leaves no folder of its own behind."""
    import nemo_run as run

    from trainer.launch.slurm_jobs import job_id_of, job_state, submit_failure_line

    held = io.StringIO()
    experiment = None
    try:
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            experiment = run.Experiment(name, log_level="WARN", base_dir=job_dir(args))
            with experiment:
                add_jobs(experiment, plan, args, jobs)
                experiment.run(detach=True)
    except Exception as error:
        line = submit_failure_line(error)
        if line is None:
            sys.stdout.write(held.getvalue())
            raise
        undo_failed_submit(experiment, made)
        raise UserError(line) from None
    sys.stdout.write(held.getvalue())
    for job in experiment.jobs:
        job_id = job_id_of(job.handle)
        state, source = job_state(job_id)
        what = "" if len(experiment.jobs) == 1 else f" ({job.id})"
        print(f"submitted Slurm job {job_id}{what}: {state} (from {source}); its log is in "
              f"{job.executor.job_dir}", flush=True)
    return 0

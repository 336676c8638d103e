"""`scripts/launch.py`: a recipe as a NeMo-Run experiment on a Slurm cluster or this machine.

The ecosystem's launcher does the launching: `nemo_run.SlurmExecutor` with its torchrun
launcher renders an sbatch script that starts one torchrun per node (`--ntasks-per-node=1`,
`--nnodes`, `--nproc-per-node`, `--node-rank $SLURM_NODEID`), a c10d rendezvous on the first
node of the allocation (`$head_node_ip`, found by `scontrol show hostnames`, never a host named
here) and `sbatch --requeue`; `nemo_run.LocalExecutor` runs torchrun on this machine. Each
torchrun starts `scripts/pretrain.py` ranks, which run as the ranks torchrun gave them.

What is checked here, before anything is submitted: the recipe and overrides (as pretrain.py
resolves them), the cluster file (`recipes/plan/cluster.py`), that the recipe's ranks fill
whole nodes of the cluster and that the cluster has that many nodes. nemo_run is imported only
inside functions: the rest of the project works without the `launch` extra.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.config.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXECUTORS = ("slurm", "local")
TEXT_OPTIONS = ("account", "partition", "time", "job_dir", "container_image")


@dataclass
class LaunchArgs:
    cluster: str | None = None
    executor: str = "slurm"
    dry_run: bool = False
    retries: int = 0  # times Slurm requeues the job after a failure
    text: dict[str, str] = field(default_factory=dict)  # account, partition, time, ...
    rest: list[str] = field(default_factory=list)  # recipe/config and overrides


def _job_path(path: str) -> str:
    """The cluster file as the job sees it: relative to the checkout the job runs in when it
    lies inside it (the checkout is linked into the job), else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(REPO))
    except ValueError:
        return str(resolved)


def parse_launch_args(argv: Sequence[str]) -> LaunchArgs:
    """Split launch.py's own options from the recipe and its overrides."""
    parsed = LaunchArgs()
    for arg in argv:
        key, sep, value = arg.partition("=")
        if arg in ("--dry-run", "--dry_run"):
            parsed.dry_run = True
        elif sep and key == "cluster":
            parsed.cluster = value
        elif sep and key == "executor":
            if value not in EXECUTORS:
                raise ConfigError(f"executor={value} is not known; use executor=slurm (a "
                                  "cluster) or executor=local (this machine)")
            parsed.executor = value
        elif sep and key == "retries":
            if not value.isdigit():
                raise ConfigError(f"retries={value} must be a whole number, e.g. retries=2")
            parsed.retries = int(value)
        elif sep and key in TEXT_OPTIONS:
            parsed.text[key] = value
        else:
            parsed.rest.append(arg)
    return parsed


@dataclass(frozen=True)
class LaunchPlan:
    """What one launch runs: the resolved config on the cluster's nodes, and pretrain's args."""

    cfg: Any  # the RunConfig, with cluster.nodes x gpus_per_node on the cluster's nodes
    nodes: int
    gpus_per_node: int
    script_args: list[str]


def plan_launch(args: LaunchArgs) -> LaunchPlan:
    """Resolve and validate the recipe, then place its ranks on the cluster's nodes."""
    from recipes.config.resolve import resolve_config
    from recipes.plan.cluster import apply_cluster, load_cluster

    cfg = resolve_config(args.rest)
    if args.cluster is None:
        raise ConfigError("cluster= is missing; name a cluster file, e.g. "
                          "cluster=conf/cluster/h100_80gb_8x8.yaml")
    cluster = load_cluster(args.cluster)
    cfg = apply_cluster(cfg, cluster)
    nodes, gpus = cfg.cluster.nodes, cfg.cluster.gpus_per_node
    if nodes > cluster.nodes:
        raise ConfigError(
            f"{cfg.name} needs {nodes} nodes of {gpus} GPUs ({nodes * gpus} ranks) but "
            f"cluster={args.cluster} has {cluster.nodes}; pick a larger cluster file or a "
            "recipe with fewer ranks")
    if args.executor == "local" and nodes > 1:
        raise ConfigError(
            f"executor=local runs on this machine only, but {cfg.name} needs {nodes} nodes on "
            f"cluster={args.cluster}; use executor=slurm")
    placed = [f"cluster.nodes={nodes}", f"cluster.gpus_per_node={gpus}"]
    placed.append(f"cluster.spec={_job_path(args.cluster)}")  # peak FLOP/s for MFU
    return LaunchPlan(cfg, nodes, gpus, [*args.rest, *placed])


def _require_nemo_run() -> None:
    if importlib.util.find_spec("nemo_run") is None:
        raise ConfigError("scripts/launch.py needs NeMo-Run, which is not installed; install "
                          "it with `pip install -e '.[launch]'`")


def job_dir(args: LaunchArgs) -> str:
    """Where NeMo-Run keeps the experiment and the job's scripts and logs (shared storage;
    outside this checkout: NeMo-Run mangles job paths inside a git work tree). Default:
    NeMo-Run's own home (`$NEMORUN_HOME`, else ~/.nemo_run)."""
    from nemo_run.config import get_nemorun_home

    return str(Path(args.text.get("job_dir") or get_nemorun_home()).resolve())


def slurm_executor(plan: LaunchPlan, args: LaunchArgs) -> Any:
    """NeMo-Run's Slurm executor: one torchrun per node, this checkout as the job's code."""
    import nemo_run as run

    text = args.text
    executor = run.SlurmExecutor(
        account=text.get("account"), partition=text.get("partition"),
        time=text.get("time", "04:00:00"), nodes=plan.nodes,
        ntasks_per_node=plan.gpus_per_node, gpus_per_node=plan.gpus_per_node,
        container_image=text.get("container_image"),
        tunnel=run.LocalTunnel(job_dir=str(Path(job_dir(args)) / "jobs")),
        job_name_prefix="mcore-",
        # The checkout is on the cluster's shared file system: link it, do not archive it.
        packager=run.GitArchivePackager(symlink_from_remote_dir=str(REPO)),
        # torchrun and python from this environment (on the shared file system too).
        setup_lines=f'export PATH="{Path(sys.executable).parent}:$PATH"',
    )
    executor.launcher = run.Torchrun()  # NeMo-Run then asks one task per node
    executor.retries = args.retries
    return executor


def local_executor(plan: LaunchPlan) -> Any:
    """NeMo-Run's local executor (torchx's local scheduler runs `torchrun` found on PATH: this
    interpreter's, which need not be on PATH when the script is run as .venv/bin/python)."""
    import nemo_run as run

    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [bin_dir, os.environ.get("PATH")]))
    return run.LocalExecutor(ntasks_per_node=plan.gpus_per_node, launcher="torchrun")


def build_task(plan: LaunchPlan, args: LaunchArgs) -> tuple[Any, Any]:
    """(executor, task): pretrain.py under torchrun on every node."""
    import nemo_run as run

    if args.executor == "slurm":  # run from the job's code dir, a link to this checkout
        return slurm_executor(plan, args), run.Script(
            path="scripts/pretrain.py", args=plan.script_args, entrypoint="python")
    return local_executor(plan), run.Script(  # runs where it is started: name the script
        path=str(REPO / "scripts" / "pretrain.py"), args=plan.script_args, entrypoint="python")


def rendered_script(experiment: Any) -> str:
    """What the experiment would submit: the sbatch script (Slurm) or the command (local)."""
    experiment.dryrun(log=False)
    info = experiment.jobs[0]._dryrun_info  # set by Job.launch(dryrun=True)
    request = info.request
    if hasattr(request, "materialize"):  # SlurmBatchRequest
        return " ".join(request.launch_cmd) + " <<'SBATCH'\n" + request.materialize() + "\nSBATCH"
    return str(info)


def run_launch(argv: Sequence[str]) -> int:
    """The whole launch command; every user mistake is a ConfigError (one line, exit 2)."""
    args = parse_launch_args(argv)
    plan = plan_launch(args)
    _require_nemo_run()
    import nemo_run as run

    executor, task = build_task(plan, args)
    with run.Experiment(f"mcore-{plan.cfg.name}", executor=executor, log_level="WARN",
                        base_dir=job_dir(args)) as experiment:
        experiment.add(task, name="pretrain")
        if args.dry_run:
            print(rendered_script(experiment))
            return 0
        experiment.run(detach=args.executor == "slurm")
    if args.executor == "local":  # ran here and waited: pass its outcome on
        state = str(experiment.jobs[0].state)
        print(f"pretrain under NeMo-Run's local executor: {state}", flush=True)
        return 0 if state.endswith("SUCCEEDED") else 1
    return 0

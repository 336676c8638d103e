"""Running a scaling sweep: each size as a pretrain run here, or as a cluster job.

Here (no `cluster=`), each size is an ordinary `scripts/pretrain.py` run on local ranks
started through torch's launcher, one after the other, and the report follows. With
`cluster=conf/cluster/<file>.yaml` each size is submitted through `scripts/launch.py`'s
NeMo-Run path (Slurm by default, `executor=local` for NeMo-Run's local executor) with its run
directory inside the sweep directory (shared storage), and `scaling.report=DIR` writes the
report once the jobs have finished (`--dry-run` checks and prints each job, writing nothing).
Either way the sweep directory holds `sweep.json` (the options and sizes), `base_config.yaml`
and one run directory per size, so the report is read from files alone. The figures and the
report itself: `trainer/tools/scaling/report.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError, config_error, error_lines
from plugins.protocol.metrics_file import METRICS_FILE
from recipes.config.links import resolved
from trainer.tools.scaling.checks import (
    damaged_sweep_line,
    field_names,
    out_problem,
    size_line,
    sweep_problem,
)
from trainer.tools.scaling.report import (
    Point,
    ScalingOptions,
    build_report,
    format_table,
    plan_points,
    read_point,
    write_plots,
)

ROOT = Path(__file__).resolve().parents[3]
SWEEP_FILE = "sweep.json"
Preflight = Callable[[Any, Any], None]  # (config, machine): trainer/entry/pipeline.py's


class ScalingRunFailed(ConfigError):
    """A size's run exited non-zero; the message names the size, its last line and its log."""


def _run_point(base_config: Path, point: Point, log: Path) -> None:
    """One size as an ordinary pretrain run on local ranks; its output goes to `log`."""
    command = [sys.executable, str(ROOT / "scripts" / "pretrain.py"),
               f"config={base_config}", *point.overrides]
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT,
                              cwd=ROOT).returncode
    if code:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise ScalingRunFailed(f"the {point.gpus}-rank run failed (exit {code}): "
                               f"{tail[0] if tail else 'no output'}; full output in {log}")


def _size_overrides(point: Point) -> list[str]:
    return [o for o in point.overrides if not o.startswith("run_dir=")]


@contextlib.contextmanager
def _refused_as_size(gpus: int):
    """A check's refusal of one size, said as that size's (`size_line`), each line its own."""
    try:
        yield
    except ConfigError as error:
        raise config_error([size_line(gpus, line) for line in error_lines(error)]) from None


def _check_points(source: list[str], points: list[Point]) -> list[Any]:
    """Every size's config, each valid before the first run starts (one line if not);
    `source`: the arguments naming the base config (`config=<sweep>/base_config.yaml`)."""
    from recipes.resolve import resolve_config

    configs = []
    for point in points:
        with _refused_as_size(point.gpus):
            configs.append(resolve_config([*source, *_size_overrides(point)]))
    return configs


def check_sizes_here(rest: list[str], points: list[Point], configs: list[Any],
                     machine: Any = None, preflight: Preflight | None = None) -> None:
    """Every size against this machine before the first starts, with the checks each size's
    pretrain run makes before it starts ranks (`check_machine`: enough GPUs or CPU ranks,
    kernels; `preflight`, the entry pipeline's, handed down by scripts/scaling.py's command:
    the layout fits its share of memory): otherwise the sizes before a refused one have
    trained in full first. The pre-flight's summary lines are the run's to print, not this
    check's."""
    from recipes.config.machine import check_machine, detect_machine
    from recipes.plan.fit import local_attention_cost

    machine = machine or detect_machine()
    for point, cfg in zip(points, configs, strict=True):
        with _refused_as_size(point.gpus), contextlib.redirect_stdout(io.StringIO()):
            check_machine(cfg, machine, [*rest, *_size_overrides(point)], local_attention_cost)
            if preflight is not None:
                preflight(cfg, machine)


def check_sizes_on_cluster(rest: list[str], points: list[Point], launch: Any) -> None:
    """Every size's job checked by the launcher's own `plan_launch` (the cluster file, the
    placement on its nodes, the site settings, the paths) before the first is submitted or
    printed: otherwise the jobs before a refused size are on the queue already. The launcher
    says its warnings again when it submits the size; here they are held back."""
    from trainer.launch.cluster import plan_launch

    for point in points:
        with _refused_as_size(point.gpus), contextlib.redirect_stdout(io.StringIO()):
            plan_launch(dataclasses.replace(launch, rest=[*rest, *point.overrides]))


def model_state_gib(cfg: Any) -> float:
    """The planner's weights + grads + optimizer state on the fullest rank (GiB): what memory
    holds before any activation (recipes/plan)."""
    from recipes.plan.build import PlanOptions, make_plan
    from recipes.plan.cluster import recipe_cluster

    plan = make_plan(cfg, recipe_cluster(cfg), PlanOptions(listed_groups=0))
    return max(stage.state.total for stage in plan.stages) / 2**30


def _report_dir(cfg: Any, options: ScalingOptions) -> Path:
    if options.out:
        return resolved(options.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return resolved(Path(cfg.output_dir) / f"scaling-{cfg.name}-{options.mode}-{stamp}")


# --- the sweep directory ----------------------------------------------------------------------

def save_sweep(sweep_dir: Path, options: ScalingOptions, points: list[Point],
               configs: list[Any]) -> None:
    """sweep.json: what the report needs besides the runs themselves."""
    sweep = {"options": dataclasses.asdict(options),
             "points": [dataclasses.asdict(point) for point in points],
             "model_state_gib": [model_state_gib(cfg) for cfg in configs]}
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(sweep, indent=2), encoding="utf-8")


def load_sweep(sweep_dir: Path) -> tuple[ScalingOptions, list[Point], list[float]]:
    """The options, sizes and model-state figures a sweep recorded; a file that is not
    JSON, or lacks what the report reads, is one line naming it and what is wrong."""
    path = sweep_dir / SWEEP_FILE
    if not path.is_file():
        raise ConfigError(f"scaling.report={sweep_dir} holds no {SWEEP_FILE}; name the "
                          "directory a scaling sweep wrote (it prints it when it starts)")
    try:
        sweep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON
        what = (f"cannot be read ({error.strerror})" if isinstance(error, OSError)
                else f"is not JSON ({str(error).split(':')[0]})")
        raise ConfigError(damaged_sweep_line(sweep_dir, path, what)) from None
    problem = sweep_problem(sweep, field_names(ScalingOptions), field_names(Point))
    if problem:
        raise ConfigError(damaged_sweep_line(sweep_dir, path, problem))
    options = ScalingOptions(**sweep["options"])
    points = [Point(**{**p, "overrides": tuple(p["overrides"])}) for p in sweep["points"]]
    return options, points, sweep["model_state_gib"]


def _finished(run_dir: Path) -> bool:
    metrics = run_dir / METRICS_FILE
    return metrics.is_file() and '"kind": "summary"' in metrics.read_text(encoding="utf-8")


def write_report(sweep_dir: Path) -> int:
    """Read every size's run from the sweep directory; write and print the report."""
    from recipes.plan.cluster import gemm_precision, load_cluster
    from recipes.resolve import resolve_config

    sweep_dir = resolved(sweep_dir)
    options, points, states = load_sweep(sweep_dir)
    unfinished = [p.gpus for p in points if not _finished(sweep_dir / f"G{p.gpus}")]
    if unfinished:
        raise ConfigError(
            f"scaling.report={sweep_dir}: the run of {unfinished[0]} ranks has not finished "
            f"(no summary in G{unfinished[0]}/metrics.jsonl); wait for its job or read its log, "
            "then run the same command again")
    cfg = resolve_config([f"config={sweep_dir / 'base_config.yaml'}"])
    peak = load_cluster(options.cluster).peak_tflops.get(gemm_precision(cfg)) \
        if options.cluster else None  # MFU's one peak: the GEMMs' precision (as a run's)
    results = [read_point(sweep_dir / f"G{point.gpus}", cfg, point, peak, state)
               for point, state in zip(points, states, strict=True)]
    report = build_report(cfg, options, results)
    (sweep_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_plots(report, sweep_dir)
    table = format_table(report)
    (sweep_dir / "report.txt").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"report: {sweep_dir} (report.txt, report.json, throughput.png, efficiency.png)")
    return 0


# --- running it -------------------------------------------------------------------------------

def _submit(source: list[str], points: list[Point], launch: Any) -> None:
    """Each size as a job through the launcher, which keeps the size's world (its
    `cluster.nodes=1 cluster.gpus_per_node=G`) and places it on the cluster's nodes."""
    from trainer.launch.cluster import run_launch

    for point in points:
        rest = [*source, *point.overrides]
        print(f"scaling: {point.gpus} ranks as a {launch.executor} job", flush=True)
        code = run_launch(dataclasses.replace(launch, rest=rest))
        if code:
            raise ScalingRunFailed(f"the {point.gpus}-rank job failed (exit {code}); its log "
                                   f"is in the launcher's job directory")


def _run_here(base_config: Path, points: list[Point], sweep_dir: Path) -> None:
    for point in points:
        print(f"scaling: {point.gpus} ranks (DP{point.data_parallel}, global batch "
              f"{point.global_batch}, {point.microbatches} micro-batches per replica)",
              flush=True)
        _run_point(base_config, point, sweep_dir / f"G{point.gpus}.log")


def run_scaling(options: ScalingOptions, launch: Any, rest: list[str],
                preflight: Preflight | None = None) -> int:
    """The whole sweep: check every size, run each (or submit each as a cluster job when
    `launch`, the launcher's arguments, is given), then the report. `preflight`: the checks a
    local run makes before its ranks start (`check_sizes_here`)."""
    from recipes.config.io import save_config
    from recipes.plan.cluster import load_cluster
    from recipes.resolve import resolve_config
    from trainer.throughput import RUN_RULES

    if options.report:
        return write_report(Path(options.report))
    if launch is not None and options.cluster is None:
        options.cluster = launch.cluster  # its peak gives MFU
    if options.cluster is not None:
        load_cluster(options.cluster)  # read now: a bad file is one line before any run
    cfg = resolve_config(rest, rules=RUN_RULES)
    problem = out_problem(options.out, cfg.output_dir)
    if problem:
        raise ConfigError(problem)
    sweep_dir = _report_dir(cfg, options)
    points = plan_points(cfg, options, sweep_dir)
    configs = _check_points(rest, points)  # every size, before the first starts
    if launch is None:
        check_sizes_here(rest, points, configs, preflight=preflight)
    else:
        check_sizes_on_cluster(rest, points, launch)
    if launch is not None and launch.dry_run:
        return _dry_run(rest, points, launch, sweep_dir)
    base_config = save_config(cfg, sweep_dir / "base_config.yaml")
    source = [f"config={base_config}"]
    save_sweep(sweep_dir, options, points, _check_points(source, points))
    if launch is None:
        _run_here(base_config, points, sweep_dir)
    else:
        _submit(source, points, launch)
        if launch.executor == "slurm":
            print(f"scaling: {len(points)} jobs submitted; when every job has finished: "
                  f"python scripts/scaling.py scaling.report={sweep_dir}")
            return 0
    return write_report(sweep_dir)


def _dry_run(rest: list[str], points: list[Point], launch: Any, sweep_dir: Path) -> int:
    """Every size checked (by then) and its job printed, nothing written: the jobs read the
    recipe and overrides as given, where a real sweep first freezes them into
    base_config.yaml."""
    _submit(rest, points, launch)
    print(f"scaling: dry run, nothing written; the sweep would write {sweep_dir}, its jobs "
          "reading the base_config.yaml frozen there instead of these arguments")
    return 0

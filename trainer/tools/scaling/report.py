"""Scaling harness: one recipe at several world sizes, and whether more GPUs paid off.

Each size is an ordinary `scripts/pretrain.py` run, here or as a cluster job (running them:
`trainer/tools/scaling/sweep.py`); the harness reads each run's `metrics.jsonl` and writes
a report: a table, JSON and PNG plots. Weak scaling keeps the per-replica batch and grows the
global batch with DP; strong scaling keeps the global batch and lets accumulation shrink. Two
sizes are compared only when their training conditions match (equal GPU counts are not equal
jobs): efficiency T_G / ((G/G0) * T_G0) is stated against the smallest comparable size, with
time and GPU-hours for a token budget, and each size gets a diagnosis of its dominant
bottleneck backed by the figure that triggered it. Definitions: `trainer/throughput.py`.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError
from plugins.protocol.metrics_file import METRICS_FILE
from recipes.plan.flops import model_flops_utilisation
from trainer.throughput import (
    PROFILE_STEPS,
    WARMUP_STEPS,
    gpu_hours_for_tokens,
    hours_for_tokens,
    scaling_efficiency,
)

MIN_STEPS = WARMUP_STEPS + 2 * PROFILE_STEPS  # warm-up, profiled window, as many measured
MODES = ("weak", "strong")


@dataclass
class ScalingOptions:
    """The `scaling.*` arguments."""

    world_sizes: list[int] = field(default_factory=lambda: [1, 2, 4])
    mode: str = "weak"
    steps: int = 8  # optimizer steps per size: 1 warm-up, 2 profiled, the rest measured
    cluster: str | None = None  # conf/cluster/*.yaml whose peak gives MFU; None: MFU unknown
    token_budget: float = 1e9  # tokens the time and GPU-hours columns are stated for
    out: str | None = None  # report directory; default runs/scaling-<recipe>-<mode>-<time>
    report: str | None = None  # write the report of a finished sweep directory (cluster jobs)


def check_world_sizes(key: str, sizes: list[int]) -> str | None:
    """`scaling.world_sizes`: distinct positive rank counts."""
    if not sizes:
        return f"{key}=[] must list rank counts, e.g. {key}=[1,2,4]"
    if any(size < 1 for size in sizes):
        return f"{key}={sizes} must hold positive rank counts, e.g. {key}=[1,2,4]"
    if len(set(sizes)) != len(sizes):
        return f"{key}={sizes} repeats a size; give each size once"
    return None


def check_steps(key: str, steps: int) -> str | None:
    """`scaling.steps`: some measured steps after the warm-up and the profiled ones."""
    if steps < MIN_STEPS:
        return (f"{key}={steps} leaves no measured steps after {WARMUP_STEPS} warm-up and "
                f"{PROFILE_STEPS} profiled ones; use {key}={MIN_STEPS} or more")
    return None


def check_token_budget(key: str, budget: float) -> str | None:
    if budget <= 0:
        return f"{key}={budget} must be a positive number, e.g. {key}=1e9"
    return None


def scaling_options(values: dict[str, Any]) -> ScalingOptions:
    """The `scaling.*` options as parsed (trainer/entry/commands.py, SCALING)."""
    fields = {name.removeprefix("scaling."): value for name, value in values.items()
              if name.startswith("scaling.")}
    options = ScalingOptions(**fields)
    options.world_sizes = sorted(options.world_sizes)
    return options


@dataclass(frozen=True)
class Point:
    """One world size of the sweep and the overrides that make its run."""

    gpus: int
    data_parallel: int
    global_batch: int
    microbatches: int  # micro-batches per replica per step (accumulation)
    overrides: tuple[str, ...]


def _global_batch(cfg: Any, mode: str, gpus: int, dp: int) -> int:
    t = cfg.train
    if mode == "weak":
        return cfg.layout.samples_per_replica * dp
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise ConfigError(
            f"scaling.mode=strong keeps train.global_batch_size={t.global_batch_size}, which "
            f"is not a multiple of micro-batch {t.micro_batch_size} x DP{dp} at {gpus} ranks; "
            f"raise train.global_batch_size to {t.micro_batch_size * dp} or drop {gpus} from "
            "scaling.world_sizes")
    return t.global_batch_size


def plan_points(cfg: Any, options: ScalingOptions, report_dir: Path) -> list[Point]:
    """Each size's layout and batch (the recipe's TP x PP x CP kept, DP grown)."""
    model_parallel = cfg.layout.model_parallel
    points = []
    for gpus in options.world_sizes:
        if gpus % model_parallel:
            raise ConfigError(
                f"scaling.world_sizes has {gpus}, not a multiple of the recipe's TP x PP x "
                f"CP = {model_parallel} ranks per replica; use multiples of {model_parallel}")
        dp = gpus // model_parallel
        batch = _global_batch(cfg, options.mode, gpus, dp)
        overrides = (
            "cluster.nodes=1", f"cluster.gpus_per_node={gpus}",
            f"train.global_batch_size={batch}", f"train.train_iters={options.steps}",
            "scheduler.warmup_iters=1", "checkpoint.save=false", "train.eval_iters=0",
            "train.eval_interval=0",
            "logging.progress_bar=false", f"logging.log_interval={options.steps}",
            "logging.exposed_comm=true",  # the profiled window: exposed communication
            f"run_dir={report_dir / f'G{gpus}'}",
        )
        microbatches = batch // (cfg.train.micro_batch_size * dp)
        points.append(Point(gpus, dp, batch, microbatches, overrides))
    return points


# --- reading a finished run ---------------------------------------------------------------

def _records(run_dir: Path) -> tuple[list[dict], dict]:
    lines = (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    summary = next(r for r in records if r["kind"] == "summary")
    return train, summary


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stage_compute(train: list[dict]) -> list[float] | None:
    """Each pipeline stage's compute seconds per step, averaged over the profiled steps."""
    rows = [r["stage_compute_s"] for r in train if r.get("stage_compute_s")]
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)] if rows else None


def _memory(train: list[dict], cfg: Any, model_state_gib: float | None) -> dict:
    """The busiest rank's peak memory over the run, against the accelerator's capacity, and
    the planner's model-state share of a rank (what is held before any activation)."""
    peaks = [r["memory_gib"] for r in train if r.get("memory_gib") is not None]
    return {"memory_gib": max(peaks) if peaks else None,
            "memory_capacity_gib": cfg.cluster.gpu_memory_gib,
            "model_state_gib": model_state_gib}


def read_point(run_dir: Path, cfg: Any, point: Point, peak: float | None,
               model_state_gib: float | None = None) -> dict:
    """One size's figures from its run: throughput, speed, conditions, step breakdown,
    memory, each pipeline stage's compute and the MoE routers' imbalance where present."""
    train, summary = _records(run_dir)
    measured = [r for r in train if r.get("measured", True)] or train
    step = _mean([r["step_time_s"] for r in measured])
    tflops = summary["model_tflops_per_gpu"]
    return {
        **_memory(train, cfg, model_state_gib),
        "stage_compute_s": _stage_compute(train),
        "moe_imbalance": _mean([r["extra"]["moe_imbalance"] for r in measured
                                if "moe_imbalance" in r.get("extra", {})]),
        "gpus": point.gpus,
        "layout": summary["layout"],
        "backend": summary["backend"],
        "effective_tokens_per_s": summary["effective_tokens_per_s"],
        "model_tflops_per_gpu": tflops,
        "mfu": model_flops_utilisation(tflops, peak) if peak else summary["mfu"],
        "step_time_s": step,
        # the median beside the mean: one slow step on a shared machine moves only the mean
        "step_time_median_s": statistics.median([r["step_time_s"] for r in measured]),
        "data_wait_s": _mean([r["data_wait_s"] for r in measured]),
        "forward_backward_s": _mean([r["forward_backward_s"] for r in measured]),
        "optimizer_s": _mean([r["optimizer_s"] for r in measured]),
        "exposed_comm_s": _mean([r["exposed_comm_s"] for r in train
                                 if r.get("exposed_comm_s") is not None]),
        "profiled_step_time_s": _mean([r["step_time_s"] for r in train
                                       if r.get("exposed_comm_s") is not None]),
        "measured_steps": summary["measured_steps"],
        "loss_tokens_per_step": _mean([r["loss_tokens"] for r in measured]),
        "conditions": {**conditions(cfg, point),
                       "loss_tokens_per_step": round(_mean([r["loss_tokens"] for r in train]))},
    }


def conditions(cfg: Any, point: Point) -> dict:
    """What must match for two sizes to train the same job (weak scaling: per replica)."""
    m = cfg.model
    return {
        "model": f"L{m.num_layers} h{m.hidden_size} ffn{m.ffn_hidden_size} "
                 f"heads{m.num_attention_heads}/{m.num_query_groups or m.num_attention_heads} "
                 f"{m.activation} vocab{m.vocab_size} experts{m.num_moe_experts or 0}",
        "seq_length": m.seq_length,
        "precision": cfg.precision.dtype,
        "micro_batch_size": cfg.train.micro_batch_size,
        "recompute": cfg.train.recompute,
        "data": f"{cfg.data.source}/{cfg.data.documents}",
        "global_batch": point.global_batch,
        "samples_per_replica": point.global_batch // point.data_parallel,
        "tokens_per_step": point.global_batch * m.seq_length,
    }


def condition_differences(base: dict, other: dict, mode: str) -> list[str]:
    """The training conditions in which `other` differs from `base`, as 'name a vs b'; weak
    scaling grows the global batch by design, strong scaling keeps it."""
    allowed = {"global_batch", "tokens_per_step", "loss_tokens_per_step"} if mode == "weak" else {
        "samples_per_replica"}
    return [f"{key} {base[key]} vs {other[key]}" for key in base
            if key not in allowed and base[key] != other.get(key)]


# --- comparing sizes and diagnosing each --------------------------------------------------

def compare(points: list[dict], mode: str, token_budget: float) -> None:
    """Add efficiency against the smallest size, or why a size is not comparable, and time
    and GPU-hours for the token budget, to each point (in place)."""
    base = points[0]
    for point in points:
        differences = condition_differences(base["conditions"], point["conditions"], mode)
        point["comparable_with"] = None if differences else base["gpus"]
        point["not_comparable"] = differences
        rate = point["effective_tokens_per_s"]
        point["efficiency"] = None if differences or not rate else scaling_efficiency(
            rate, point["gpus"], base["effective_tokens_per_s"], base["gpus"])
        point["hours_for_budget"] = hours_for_tokens(token_budget, rate) if rate else None
        point["gpu_hours_for_budget"] = (
            gpu_hours_for_tokens(token_budget, rate, point["gpus"]) if rate else None)


# Shares of the step above which a cause is named; below them the step is compute-bound.
DATA_WAIT_SHARE = 0.10
COMM_SHARE = 0.20
COMM_GROWTH = 0.05  # exposed-comm share this much above the smallest size's
OPTIMIZER_SHARE = 0.25
MEMORY_SHARE = 0.90  # peak memory of the busiest rank over the accelerator's capacity
MODEL_STATE_SHARE = 0.50  # ... of which weights, grads and optimizer state (before activations)
STAGE_IMBALANCE = 1.25  # busiest pipeline stage's compute over the stages' mean
EXPERT_IMBALANCE = 1.50  # busiest expert's tokens over the mean (MoE routers)

CHANGES = {
    "data wait": "more data-loader workers and prefetching the next batches while the step "
                 "computes, then measure the same steps again",
    "exposed communication": "overlap the DP gradient reduce with backward "
                             "(optimizer.overlap_grad_reduce=true), synchronise DP less often "
                             "(more accumulation per step), keep TP/PP groups inside a node",
    "optimizer update": "shard the optimizer over DP (optimizer.distributed=true) so each rank "
                        "updates only its share",
    "compute": "nothing is waiting: raise the micro-batch if memory allows, or compare MFU "
               "with the accelerator's peak",
    "memory (model state)": "shard weights, gradients and optimizer state before activations "
                            "arrive: optimizer.distributed=true, more TP or PP, or offload",
    "memory (activations)": "smaller micro-batches with more accumulation, activation "
                            "recompute (train.recompute=selective|full), SP/CP for long sequences",
    "busy stage": "rebalance the pipeline: move layers off the busy stage "
                  "(parallel.first_stage_layers / parallel.last_stage_layers; the first stage "
                  "also holds the embedding, the last the output layer and loss) or interleave "
                  "(parallel.virtual_pipeline)",
    "busy expert": "balance the routers: raise model.moe_aux_loss_coeff (load-balancing loss) "
                   "and check the router's token counts per expert again",
}

# With several pipeline stages a rank also waits for its neighbours' activations and gradients
# (the pipeline bubble), which the profiler sees as point-to-point communication.
PIPELINE_WAIT = ("; with pipeline stages part of this is the bubble: more micro-batches per "
                 "step (train.global_batch_size) or interleaving (parallel.virtual_pipeline)")


def _shares(point: dict) -> dict[str, float]:
    step = point["step_time_s"] or 1.0
    comm_step = point["profiled_step_time_s"] or step
    comm = (point["exposed_comm_s"] or 0.0) / comm_step
    fwd_bwd = point["forward_backward_s"] / step
    return {"data wait": point["data_wait_s"] / step, "exposed communication": comm,
            "optimizer update": point["optimizer_s"] / step,
            "compute": max(0.0, fwd_bwd - comm)}


def memory_finding(point: dict) -> tuple[str, str] | None:
    """(cause, evidence) when the busiest rank's peak nears the accelerator's capacity: model
    state when the planner puts weights, grads and optimizer state at half of it or more."""
    peak, capacity = point.get("memory_gib"), point.get("memory_capacity_gib")
    if peak is None or not capacity or peak < MEMORY_SHARE * capacity:
        return None
    state = point.get("model_state_gib")
    kind = "model state" if state and state >= MODEL_STATE_SHARE * capacity else "activations"
    held = f"; model state {state:.1f} GiB" if state else ""
    return (f"memory ({kind})",
            f"peak {peak:.1f} GiB of {capacity:.1f} GiB ({peak / capacity:.0%}){held}")


def stage_finding(point: dict) -> tuple[str, str] | None:
    """(cause, evidence) when one pipeline stage computes much longer than the others."""
    stages = point.get("stage_compute_s") or []
    if len(stages) < 2 or not sum(stages):
        return None
    mean = sum(stages) / len(stages)
    busiest = max(range(len(stages)), key=stages.__getitem__)
    if stages[busiest] < STAGE_IMBALANCE * mean:
        return None
    return ("busy stage", f"stage {busiest} computes {stages[busiest]:.3g} s per step vs "
                          f"{mean:.3g} s mean over {len(stages)} stages "
                          f"({stages[busiest] / mean:.2f}x)")


def expert_finding(point: dict) -> tuple[str, str] | None:
    """(cause, evidence) when the routers send one expert far more tokens than the mean."""
    imbalance = point.get("moe_imbalance")
    if imbalance is None or imbalance < EXPERT_IMBALANCE:
        return None
    return ("busy expert", f"busiest expert {imbalance:.2f}x the mean tokens per expert")


def _time_cause(point: dict, base: dict) -> tuple[str, str, dict[str, float]]:
    """The phase that dominates the step's time (compute when nothing waits)."""
    shares, base_comm = _shares(point), _shares(base)["exposed communication"]
    triggered = []
    if shares["data wait"] >= DATA_WAIT_SHARE:
        triggered.append("data wait")
    comm = shares["exposed communication"]
    if comm >= COMM_SHARE and (point is base or comm >= base_comm + COMM_GROWTH):
        triggered.append("exposed communication")
    if shares["optimizer update"] >= OPTIMIZER_SHARE:
        triggered.append("optimizer update")
    cause = max(triggered, key=shares.get) if triggered else "compute"
    evidence = f"{cause} {shares[cause]:.0%} of the step"
    if cause == "exposed communication" and point is not base:
        evidence += f" (vs {base_comm:.0%} at {base['gpus']} ranks)"
    return cause, evidence, shares


def diagnose(point: dict, base: dict) -> dict:
    """The dominant bottleneck of one size, the change to try and the figure behind it.

    Memory near capacity comes first (nothing else can be tried until the run fits with room);
    then the phase that dominates the step's time. A busy pipeline stage or expert is named
    beside it (`also`), each with its own figure and change.
    """
    cause, evidence, shares = _time_cause(point, base)
    findings = [f for f in (memory_finding(point), stage_finding(point), expert_finding(point))
                if f is not None]
    if findings and findings[0][0].startswith("memory"):
        (cause, evidence), findings = findings[0], findings[1:]
    also = [{"bottleneck": c, "evidence": e, "change": CHANGES[c]} for c, e in findings]
    change = CHANGES[cause]
    if cause == "exposed communication" and len(point.get("stage_compute_s") or []) > 1:
        change += PIPELINE_WAIT
    return {"bottleneck": cause, "evidence": evidence, "change": change, "also": also,
            "shares": {name: round(value, 4) for name, value in shares.items()}}


# --- the report -------------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
    """`value` in `spec`, or '-' (unknown) right-aligned to the same width."""
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
    return format(value, spec) if value is not None else "-".rjust(int(width or 1))


def format_table(report: dict) -> str:
    """The report as text: one row per size, the conditions, then each size's diagnosis."""
    head = (f"{'GPUs':>4} {'layout':<26} {'batch':>5} {'tok/step':>8} {'tokens/s':>10} "
            f"{'eff.':>6} {'TFLOP/s/GPU':>11} {'MFU':>6} {'data':>5} {'fwd-bwd':>7} "
            f"{'opt':>5} {'comm':>5} {'h/budget':>9} {'GPU-h':>9}")
    lines = [report["title"], head]
    for p in report["points"]:
        s, c = p["diagnosis"]["shares"], p["conditions"]
        lines.append(
            f"{p['gpus']:>4} {p['layout']:<26} {c['global_batch']:>5} "
            f"{c['tokens_per_step']:>8} {p['effective_tokens_per_s']:>10,.0f} "
            f"{_fmt(p['efficiency'], '>6.1%')} {p['model_tflops_per_gpu']:>11.4g} "
            f"{_fmt(p['mfu'], '>6.1%')} {s['data wait']:>5.0%} "
            f"{p['forward_backward_s'] / p['step_time_s']:>7.0%} {s['optimizer update']:>5.0%} "
            f"{s['exposed communication']:>5.0%} {_fmt(p['hours_for_budget'], '>9.1f')} "
            f"{_fmt(p['gpu_hours_for_budget'], '>9.1f')}")
    lines += ["", *report["notes"], ""]
    for p in report["points"]:
        d = p["diagnosis"]
        lines.append(f"{p['gpus']} ranks: {d['bottleneck']} ({d['evidence']}) -> {d['change']}")
        for extra in d.get("also", []):
            lines.append(f"  also {extra['bottleneck']} ({extra['evidence']}) -> "
                         f"{extra['change']}")
        if "caveat" in d:
            lines.append(f"  caveat: {d['caveat']}")
        if p["not_comparable"]:
            lines.append(f"  not comparable with {report['points'][0]['gpus']} ranks: "
                         + "; ".join(p["not_comparable"]))
    return "\n".join(lines)


def _notes(cfg: Any, options: ScalingOptions, points: list[dict]) -> list[str]:
    c = points[0]["conditions"]
    kind = ("per-replica batch fixed, global batch grows with DP (different jobs per token "
            "seen; compare speed, not convergence)" if options.mode == "weak"
            else "global batch fixed, accumulation shrinks as DP grows")
    device = "CPU ranks (gloo): CPU figures, not GPU ones" if "CPU" in points[0]["backend"] \
        else "GPU ranks"
    peak = (f"MFU against {options.cluster}" if options.cluster
            else "MFU unknown: no peak (give scaling.cluster=conf/cluster/<file>.yaml)")
    return [
        f"{options.mode} scaling: {kind}; {device}",
        f"sequence length {c['seq_length']}, precision {c['precision']}, micro-batch "
        f"{c['micro_batch_size']}, {options.steps} steps per size ({WARMUP_STEPS} warm-up, "
        f"{PROFILE_STEPS} profiled for exposed communication, the rest measured)",
        f"efficiency = T_G / ((G/G0) * T_G0) against G0 = {points[0]['gpus']}; time and "
        f"GPU-hours for {options.token_budget:.3g} loss tokens; {peak}",
    ]


def write_plots(report: dict, report_dir: Path) -> list[Path]:
    """throughput.png and efficiency.png against GPUs, each with the ideal (linear) line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["points"]
    base = points[0]
    gpus = [p["gpus"] for p in points]
    ideal = [base["effective_tokens_per_s"] * g / base["gpus"] for g in gpus]
    figures = {
        "throughput.png": ("effective tokens/s", [p["effective_tokens_per_s"] for p in points],
                           ideal),
        "efficiency.png": ("scaling efficiency", [p["efficiency"] for p in points],
                           [1.0] * len(gpus)),
    }
    paths = []
    for name, (label, values, reference) in figures.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(gpus, reference, "--", color="gray", label="ideal (linear from "
                f"{base['gpus']} ranks)")
        shown = [(g, v) for g, v in zip(gpus, values, strict=True) if v is not None]
        ax.plot([g for g, _ in shown], [v for _, v in shown], "o-", label="measured")
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel(label)
        ax.set_xticks(gpus)
        ax.set_title(report["title"], fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(report_dir / name, dpi=100)
        plt.close(fig)
        paths.append(report_dir / name)
    return paths


def build_report(cfg: Any, options: ScalingOptions, points: list[dict]) -> dict:
    """The comparisons, the diagnoses and the notes that make the figures readable."""
    compare(points, options.mode, options.token_budget)
    cores = os.cpu_count() or 1
    for point in points:
        point["diagnosis"] = diagnose(point, points[0])
        if "CPU" in point["backend"] and point["gpus"] > cores:
            point["diagnosis"]["caveat"] = (
                f"{point['gpus']} CPU ranks share {cores} cores: a rank waiting for a "
                "descheduled peer shows up as communication")
    device = "CPU" if "CPU" in points[0]["backend"] else "GPU"
    return {
        "title": f"{cfg.name}: {options.mode} scaling over {options.world_sizes} ranks "
                 f"({device} figures)",
        "recipe": cfg.name,
        "mode": options.mode,
        "options": asdict(options),
        "notes": _notes(cfg, options, points),
        "points": points,
    }

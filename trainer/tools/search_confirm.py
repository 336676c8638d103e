"""`scripts/plan.py search=true confirm=K`: the search's top K layouts (or, with
`confirm_pick=spread`, K spread over its whole ranking) run for a few steps each through the
scaling harness's measurement, re-ranked by measured step time.

Each layout is one ordinary pretrain run on local ranks (`scaling.sweep._run_point`, the
harness's runner) with the harness's short-run overrides, and its step time is the harness's
reading of `metrics.jsonl` (`scaling.report.read_point`'s median of the measured steps, which
one slow step on a shared machine does not move, where the mean would).
The report sets predicted against measured and gives Spearman's rank correlation between them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from recipes.config.io import save_config
from recipes.plan.search import apply_candidate
from trainer.tools.scaling.report import Point, read_point
from trainer.tools.scaling.sweep import _run_point

ROOT = Path(__file__).resolve().parents[2]


def short_run_overrides(layout: Any, steps: int, run_dir: Path) -> tuple[str, ...]:
    """The scaling harness's short run (plan_points' overrides) at this layout's world."""
    return ("cluster.nodes=1", f"cluster.gpus_per_node={layout.world_size}",
            f"train.train_iters={steps}", "scheduler.warmup_iters=1", "checkpoint.save=false",
            "train.eval_iters=0", "train.eval_interval=0", "logging.progress_bar=false",
            f"logging.log_interval={steps}", f"run_dir={run_dir}")


def ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks."""
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0


def measure(cfg: Any, evaluated: list[Any], steps: int, out: Path) -> list[float]:
    """Each layout's measured step time (seconds), run one after the other on local ranks."""
    out.mkdir(parents=True, exist_ok=True)
    measured = []
    for i, e in enumerate(evaluated):
        run = apply_candidate(cfg, e.candidate)
        layout = run.layout
        run_dir = out / f"L{i + 1}"
        base = save_config(run, out / f"L{i + 1}.yaml")
        point = Point(layout.world_size, layout.data_parallel, layout.global_batch,
                      layout.microbatches, short_run_overrides(layout, steps, run_dir))
        print(f"confirm: {i + 1}/{len(evaluated)} {e.candidate.describe()}", flush=True)
        _run_point(base, point, out / f"L{i + 1}.log")
        measured.append(read_point(run_dir, run, point, None)["step_time_median_s"])
    return measured


def confirm_lines(evaluated: list[Any], measured: list[float],
                  search_ranks: list[int] | None = None) -> list[str]:
    """The runs re-ranked by measured step time; `search_ranks` are the layouts' ranks among
    all that fit (the top K's are 1..K)."""
    predicted = [e.seconds for e in evaluated]
    by_measured, by_predicted = ranks(measured), ranks(predicted)
    search_ranks = search_ranks or list(range(1, len(evaluated) + 1))
    lines = ["confirmed by short runs (re-ranked by measured step time):",
             "  measured rank  predicted rank  search rank  predicted s  measured s  layout"]
    for i in sorted(range(len(evaluated)), key=lambda i: measured[i]):
        lines.append(f"  {by_measured[i]:>13g}  {by_predicted[i]:>14g}  {search_ranks[i]:>11}"
                     f"  {predicted[i]:>11.4f}  {measured[i]:>10.4f}  "
                     f"{evaluated[i].candidate.describe()}")
    lines.append(f"  Spearman rho (predicted vs measured step time): "
                 f"{spearman(predicted, measured):.2f} over {len(evaluated)} layouts")
    return lines


def run_confirm(cfg: Any, picked: list[tuple[int, Any]], steps: int) -> list[str]:
    """What the search prints after its table with `confirm=K`: `picked` are the layouts with
    their search ranks."""
    out = ROOT / "runs" / f"confirm-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    evaluated = [e for _, e in picked]
    measured = measure(cfg, evaluated, steps, out)
    return [*confirm_lines(evaluated, measured, [rank for rank, _ in picked]),
            f"  runs and logs: {out}"]

"""The layout search's speed (`scripts/bench_search.py` is the usage): the search as it runs
(dominated layouts pruned, per-stage figures memoised) against the exhaustive search measured
in the same process (every layout planned in full, nothing memoised), the two run in turn so
a shared machine's load falls on both alike; and the check that both rank the same top N
layouts with the same figures, without which the speed says nothing.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from recipes.plan.cluster import apply_cluster, load_cluster, recipe_cluster
from recipes.plan.search import Evaluated, SearchResult, search
from recipes.resolve import build_config


def timed_search(cfg: Any, cluster: Any, top: int,
                 exhaustive: bool) -> tuple[float, float, SearchResult]:
    """One search: its wall-clock and CPU seconds, and its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = search(cfg, cluster, top=top, exhaustive=exhaustive)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def figures(e: Evaluated) -> tuple:
    """What the search answers of one listed layout: the layout, its step time and its
    breakdown, its peak."""
    return e.candidate, e.seconds, e.time.items() if e.time else None, e.peak


def first_difference(reference: SearchResult, result: SearchResult) -> str | None:
    """None when both list the same top N in the same order with the same figures and as many
    layouts fit; else the first place they differ, in words."""
    for place, (want, got) in enumerate(zip(reference.listed, result.listed, strict=False),
                                        start=1):
        if figures(want) != figures(got):
            return (f"place {place}: exhaustive {want.candidate.describe()} {want.seconds:.6g} s"
                    f" {want.peak / 1e9:.6g} GB, search {got.candidate.describe()} "
                    f"{got.seconds:.6g} s {got.peak / 1e9:.6g} GB")
    if len(reference.listed) != len(result.listed):
        return (f"exhaustive lists {len(reference.listed)} layouts, search "
                f"{len(result.listed)}")
    if len(reference.fitting) != len(result.fitting):
        return (f"{len(reference.fitting)} fit in the exhaustive search, "
                f"{len(result.fitting)} in the search")
    return None


def counts(result: SearchResult) -> str:
    planned = result.enumerated - result.skipped
    return (f"{result.enumerated:,} layouts, {planned:,} planned for memory, "
            f"{result.timed:,} of them in full (traffic and step time)")


def _median(runs: list[tuple[float, float, SearchResult]], index: int) -> float:
    return statistics.median(run[index] for run in runs)


def run_bench_search(rest: Sequence[str], cluster_file: str | None, top: int,
                     repeats: int) -> int:
    """Time both searches `repeats` times each, in turn; exit 0 when they agree, 1 if not."""
    cfg = build_config(rest)
    cluster = load_cluster(cluster_file) if cluster_file else recipe_cluster(cfg)
    if cluster_file:
        cfg = apply_cluster(cfg, cluster)
    runs: dict[bool, list[tuple[float, float, SearchResult]]] = {True: [], False: []}
    for _ in range(repeats):
        for exhaustive in (True, False):
            runs[exhaustive].append(timed_search(cfg, cluster, top, exhaustive))
    reference, fast = runs[True][-1][2], runs[False][-1][2]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"search {cfg.name} on {cluster.name} ({reference.world:,} GPUs), top {top}, "
          f"{repeats} runs each in turn; load average {load} on {os.cpu_count()} cores")
    for name, exhaustive in (("exhaustive (reference)", True), ("search", False)):
        print(f"  {name:<22} median {_median(runs[exhaustive], 0):.3f} s wall, "
              f"{_median(runs[exhaustive], 1):.3f} s CPU; {counts(runs[exhaustive][-1][2])}")
    wall = _median(runs[False], 0) / _median(runs[True], 0)
    cpu = _median(runs[False], 1) / _median(runs[True], 1)
    print(f"  search / exhaustive: {wall:.3f} wall, {cpu:.3f} CPU "
          f"({1 / cpu:.1f}x faster in CPU time)")
    difference = first_difference(reference, fast)
    if difference:
        print(f"  top {top}: DIFFERENT at {difference}")
        return 1
    print(f"  top {top}: the same layouts in the same order with the same step times, "
          f"breakdowns and peaks; {len(fast.fitting):,} fit in both")
    return 0

"""Exact best-fit-decreasing packing against naive next-fit, timed per million documents
(`scripts/bench_packing.py` is the usage). The figures are ratios and counts measured in the
same process: packs over the lower bound ceil(tokens / pack size), best-fit time over next-fit;
then the trainer's order of a packed blend's rows (`trainer/pack_order.py`): Megatron's
compiled rule written into the mapped files every rank reads, against the earlier rule in
Python (`data.pack_order=v1`), per million rows of a three-source blend.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from data_prep.packing import next_fit_pack_count, pack_documents

PACK_SIZES = (4096, 8192)
GOAL_SECONDS_PER_MILLION = 0.1
GOAL_RATIO = 1.0001
ORDER_WEIGHTS = (0.5, 0.3, 0.2)  # a three-source blend, packs in the same shares
GOAL_ORDER_SECONDS_PER_MILLION = 0.1


def lognormal_lengths(documents: int, seed: int) -> np.ndarray:
    draws = np.random.default_rng(seed).lognormal(np.log(300.0), 1.0, documents)
    return np.clip(np.rint(draws), 1, 8192).astype(np.int64)


def best_of_three(run) -> tuple[float, float, object]:
    """Best wall-clock time of 3 runs after a warm-up, the CPU time of that run, the result."""
    result = run()  # warm-up
    times = []
    for _ in range(3):
        start, cpu = time.perf_counter(), time.process_time()
        result = run()
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return *min(times), result


def report(lengths: np.ndarray, pack_size: int) -> bool:
    per_million = 1e6 / len(lengths)
    seconds, cpu, packing = best_of_three(lambda: pack_documents(lengths, pack_size))
    naive_seconds, _, naive_packs = best_of_three(lambda: next_fit_pack_count(lengths, pack_size))
    s = packing.stats
    ratio = s.packs / s.lower_bound
    print(
        f"pack {pack_size}: best-fit-decreasing {seconds * per_million:.3f} s per 1M documents "
        f"(CPU {cpu * per_million:.3f} s) | packs {s.packs:,} | lower bound {s.lower_bound:,} | "
        f"packs/bound {ratio:.6f} | efficiency {s.efficiency:.4%} | "
        f"split documents {s.split_documents:,}"
    )
    print(
        f"  next-fit in document order: {naive_seconds * per_million:.3f} s per 1M documents, "
        f"{naive_packs:,} packs (efficiency {s.tokens / (naive_packs * pack_size):.2%}); "
        f"time next-fit/best-fit {naive_seconds / seconds:.2f}x, "
        f"packs next-fit/best-fit {naive_packs / s.packs:.4f}x"
    )
    # The time goal is per million documents; smaller runs are dominated by fixed costs.
    timed = len(lengths) >= 1_000_000
    met = ratio <= GOAL_RATIO and (not timed or seconds * per_million <= GOAL_SECONDS_PER_MILLION)
    time_goal = (
        f"<= {GOAL_SECONDS_PER_MILLION} s per 1M documents"
        if timed
        else "time not judged below 1M documents"
    )
    print(f"  goals ({time_goal}, <= {GOAL_RATIO} x lower bound): {'met' if met else 'MISSED'}")
    return met




def report_order(rows: int) -> bool:
    """The rows' order of `rows` packs in three sources, each rule timed by its best of 3."""
    from trainer.pack_order import cached_order, v1_order

    counts = [round(rows * w) for w in ORDER_WEIGHTS[:-1]]
    counts.append(rows - sum(counts))
    per_million = 1e6 / rows

    def written() -> None:
        with tempfile.TemporaryDirectory() as folder:
            cached_order(Path(folder), "megatron", counts, ORDER_WEIGHTS, build=True)

    seconds, cpu, _ = best_of_three(written)
    python, _, _ = best_of_three(lambda: v1_order(counts, ORDER_WEIGHTS))
    print(f"rows' order, {rows:,} rows of 3 sources: Megatron's rule written to mapped files "
          f"{seconds * per_million:.3f} s per 1M rows (CPU {cpu * per_million:.3f} s, "
          f"{10 * rows / 2**20:.1f} MiB) | v1 rule in Python {python * per_million:.3f} s per "
          f"1M rows | time v1/megatron {python / seconds:.1f}x")
    met = rows < 1_000_000 or seconds * per_million <= GOAL_ORDER_SECONDS_PER_MILLION
    print(f"  goal (<= {GOAL_ORDER_SECONDS_PER_MILLION} s per 1M rows, judged from 1M rows): "
          f"{'met' if met else 'MISSED'}")
    return met


def run_bench_packing(documents: int, seed: int) -> int:
    """Both pack sizes and the rows' order (as many rows as documents); exit 0 when every goal
    is met, 1 otherwise."""
    lengths = lognormal_lengths(documents, seed)
    print(
        f"{len(lengths):,} documents (seed {seed}), log-normal median 300 sigma 1.0 "
        f"clipped to 1..8192: mean {lengths.mean():.1f} tokens, one thread, best of 3 runs"
    )
    met = [report(lengths, pack_size) for pack_size in PACK_SIZES]
    met.append(report_order(documents))
    return 0 if all(met) else 1

"""Benchmark: exact best-fit-decreasing packing (data_prep/packing.py) against naive next-fit.

usage: python scripts/bench_packing.py [documents=N] [seed=S]

    python scripts/bench_packing.py                    # 1,000,000 documents, seed 0
    python scripts/bench_packing.py documents=20000 seed=3

Draws log-normal document lengths (median 300 tokens, sigma 1.0, clipped to 1..8192), packs them
at 4096 and 8192 tokens with long documents split, on one thread, and prints per pack size the
best of 3 timed runs after a warm-up (wall-clock seconds per 1M documents, and the CPU seconds
of that run: wall-clock well above them means the process waited for a busy core), packs, the
lower bound ceil(tokens / pack size), their ratio and the efficiency, then next-fit in document
order measured the same way. Goals: <= 0.1 s per 1M documents and <= 1.0001 x the lower bound.
"""

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"  # one thread, set before numpy is imported

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_prep.packing import next_fit_pack_count, pack_documents  # noqa: E402

PACK_SIZES = (4096, 8192)
GOAL_SECONDS_PER_MILLION = 0.1
GOAL_RATIO = 1.0001


def parse(argv: list[str]) -> dict[str, int] | str:
    """The settings, or a one-line error."""
    values = {"documents": 1_000_000, "seed": 0}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if key not in values or not sep or not value.isdigit():
            return (
                f"argument {arg!r} is not one of documents=N, seed=S (N, S non-negative "
                "integers); e.g. python scripts/bench_packing.py documents=20000 seed=3"
            )
        values[key] = int(value)
    if values["documents"] == 0:
        return "documents=0 leaves nothing to pack; use documents=1 or more"
    return values


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


def main(argv: list[str]) -> int:
    if any(arg in ("--help", "-h", "help") for arg in argv):
        print(__doc__.strip())
        return 0
    args = parse(argv)
    if isinstance(args, str):
        print(f"error: {args}", file=sys.stderr)
        return 2
    lengths = lognormal_lengths(args["documents"], args["seed"])
    print(
        f"{len(lengths):,} documents (seed {args['seed']}), log-normal median 300 sigma 1.0 "
        f"clipped to 1..8192: mean {lengths.mean():.1f} tokens, one thread, best of 3 runs"
    )
    met = [report(lengths, pack_size) for pack_size in PACK_SIZES]
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

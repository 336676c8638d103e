"""`scripts/plan.py calibrate=true cluster=FILE`: measure this machine's GEMM throughput by
shape and fit the search's GEMM model to it (`recipes/plan/steptime.py`): the share of the
cluster file's peak a large GEMM reaches (`gemm_peak_fraction`) and the dimension at which a
GEMM's throughput halves (`gemm_half_dim`). It prints the two lines to put in the cluster file;
bandwidths are not measured yet.
"""

from __future__ import annotations

import math
import time
from typing import Any

SIZES = (32, 64, 128, 256, 512, 1024)


def measure_gemms(dtype: str, sizes: tuple[int, ...] = SIZES,
                  seconds: float = 0.2) -> list[tuple[int, float]]:
    """(d, TFLOP/s) of a [d, d] x [d, d] product on this process's device."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    found = []
    for d in sizes:
        a = torch.randn(d, d, dtype=kind, device=device)
        b = torch.randn(d, d, dtype=kind, device=device)
        torch.matmul(a, b)
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.matmul(a, b)
            reps += 1
        if device == "cuda":
            torch.cuda.synchronize()
        found.append((d, 2 * d**3 * reps / (time.perf_counter() - start) / 1e12))
    return found


def fit_gemm_model(points: list[tuple[int, float]], peak_tflops: float) -> tuple[float, float]:
    """(peak fraction, half dimension) of throughput = peak x f x (d/(d+h))^3, least squares
    in log space: for each h on a grid, f is the geometric mean of the residual shares."""
    best = (math.inf, 1.0, 1.0)
    for step in range(0, 1001):
        h = 0.5 * 16384 ** (step / 1000)  # 0.5 to 8,192, geometric
        logs = [math.log(t / peak_tflops) - 3 * math.log(d / (d + h)) for d, t in points]
        log_f = sum(logs) / len(logs)
        error = sum((x - log_f) ** 2 for x in logs)
        if error < best[0]:
            best = (error, math.exp(log_f), h)
    return best[1], best[2]


def calibration_lines(cluster: Any, dtype: str) -> list[str]:
    points = measure_gemms(dtype)
    fraction, half = fit_gemm_model(points, cluster.peak_tflops[dtype])
    shapes = ", ".join(f"{d}: {t * 1e3:.2f}" for d, t in points)
    return [f"calibrate: {dtype} GEMM [d,d]x[d,d] GFLOP/s by d: {shapes}",
            f"calibrate: fit against {cluster.name}'s peak {cluster.peak_tflops[dtype]:g} "
            "TFLOP/s; put these in the cluster file:",
            f"gemm_peak_fraction: {fraction:.3f}", f"gemm_half_dim: {half:.1f}"]

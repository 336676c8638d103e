"""`scripts/plan.py calibrate=true cluster=FILE`: measure this machine and write the figures
into the cluster file.

- GEMM throughput by shape, fitted to the search's GEMM model (`recipes/plan/steptime.py`):
  the share of the cluster file's peak a large GEMM reaches (`gemm_peak_fraction`) and the
  dimension at which a GEMM's throughput halves (`gemm_half_dim`);
- collectives inside a node: all-reduces of 4 B to 8 MB over the node's ranks (gloo on CPU,
  NCCL over this node's GPUs), fitted as time = latency + bytes sent / bandwidth: the
  per-rank bandwidth (`intra_node_gb_per_s`, one direction) and the per-message latency
  (`collective_latency_us`) the step model prices for every collective, and the time of a
  small kernel (`kernel_overhead_us`), what each of a layer's kernels costs beyond its
  FLOPs: while every rank runs them on GPUs, on one rank alone on CPU ranks, whose sharing
  of the cores `host_cores` prices instead. Across nodes is not measured from one machine:
  `inter_node_gb_per_s` stays the file's;
- for a `device: cpu` file, the CPU cores this process may run on (`host_cores`,
  `os.sched_getaffinity`), which the node's ranks share; GEMMs are then timed on the threads
  one rank gets (`cluster.threads_per_rank`), not on every core.
- on CPU ranks, `kernel_overhead_us` from the recipe's own layers rather than a bare product:
  its model on one rank (world size 1, gloo), forward and backward of one of its
  micro-batches with 1 and 3 layers, one thread; the two layers' difference less their GEMMs
  as the step model prices them (at the fit above), over the kernels the step model counts
  for them (`steptime.layer_kernels`), is what each kernel costs through autograd and Megatron's
  modules (and the non-GEMM work the model has no other term for).
Each key is replaced in place (its comment kept) or appended; the rest of the file is kept.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

SIZES = (32, 64, 128, 256, 512, 1024)


def host_cores_figure(device: str) -> dict[str, int]:
    """`host_cores` for a CPU cluster file: the cores this process (and the ranks it starts)
    may run on; nothing for a GPU file, whose ranks each have a device."""
    return {"host_cores": len(os.sched_getaffinity(0))} if device == "cpu" else {}


def measure_gemms(dtype: str, sizes: tuple[int, ...] = SIZES, seconds: float = 0.2,
                  threads: int | None = None) -> list[tuple[int, float]]:
    """(d, TFLOP/s) of a [d, d] x [d, d] product on this process's device (on CPU with
    `threads` intra-op threads, None: torch's default)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
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


COLLECTIVE_BYTES = tuple(4 * 8**i for i in range(8))  # 4 B to 8 MB


def _all_reduce_rank(rank: int, world: int, store_path: str, backend: str,
                     sizes: tuple[int, ...], seconds: float, out: Any,
                     kernel_alone: bool = False) -> None:
    """One rank of the collective measurement: mean seconds of an all-reduce of each size, and
    of a small kernel on rank 0 (with every rank running them, or alone)."""
    import torch

    store = torch.distributed.FileStore(store_path, world)
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    small = torch.randn(32, 32, device=device)
    torch.distributed.barrier()
    start = time.perf_counter()  # every rank at once (the node busy), or rank 0 alone
    if rank == 0 or not kernel_alone:
        for _ in range(500):
            torch.matmul(small, small)
    if backend == "nccl":
        torch.cuda.synchronize()
    kernel = (time.perf_counter() - start) / 500
    torch.distributed.barrier()
    found = []
    for size in sizes:
        t = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        torch.distributed.all_reduce(t)
        start = time.perf_counter()
        for _ in range(3):  # every rank runs the same calls: time three, then fill `seconds`
            torch.distributed.all_reduce(t)
        reps = torch.tensor([max(3, min(2000, int(seconds * 3 / max(
            time.perf_counter() - start, 1e-9))))], dtype=torch.int64, device=device)
        torch.distributed.broadcast(reps, 0)  # rank 0's count, on every rank
        if backend == "nccl":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(int(reps.item())):
            torch.distributed.all_reduce(t)
        if backend == "nccl":
            torch.cuda.synchronize()
        found.append((size, (time.perf_counter() - start) / int(reps.item())))
    if rank == 0:
        out.put((kernel, found))
    torch.distributed.destroy_process_group()


def measure_collectives(ranks: int, sizes: tuple[int, ...] = COLLECTIVE_BYTES,
                        seconds: float = 0.2, kernel_alone: bool = False,
                        ) -> tuple[str, list[tuple[int, float]], float]:
    """(backend, [(bytes, seconds of one all-reduce)], seconds of one small kernel on rank 0
    while every rank runs them, or alone) over `ranks` local processes."""
    import tempfile

    import torch
    import torch.multiprocessing as mp

    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks \
        else "gloo"
    context = mp.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [context.Process(target=_all_reduce_rank, args=(
            r, ranks, f"{folder}/store", backend, sizes, seconds, out, kernel_alone))
            for r in range(ranks)]
        for p in procs:
            p.start()
        kernel, found = out.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
    return backend, found, kernel


def fit_collectives(points: list[tuple[int, float]], ranks: int) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s per rank, one direction) of time = latency +
    sent / bandwidth, least squares; a ring all-reduce sends 2 (n-1)/n of the bytes."""
    xs = [size * 2 * (ranks - 1) / ranks for size, _ in points]
    ys = [seconds for _, seconds in points]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(
        sum((x - mx) ** 2 for x in xs), 1e-30)
    slope = max(slope, 1e-15)
    latency = max(0.0, my - slope * mx) if n > 1 else 0.0
    return latency, 1.0 / slope


def refuse_read_only_file(path: str) -> None:
    """A cluster file whose owner may not write it (mode 444, kept so on purpose) is not
    replaced: the rename that writes the figures would go past its mode (for its owner, and
    always for root). One line, before any measurement."""
    import stat
    from pathlib import Path

    from plugins.protocol.errors import ConfigError

    if not Path(path).stat().st_mode & stat.S_IWUSR:
        raise ConfigError(f"cluster={path} is read-only; calibrate=true writes its figures into "
                          f"it: make it writable (chmod u+w {path}), or copy it and calibrate "
                          "the copy")


def update_cluster_file(path: str, figures: dict[str, float]) -> None:
    """Set each `key: value` of the cluster file to the measured figure, keeping the line's
    comment and every other line; keys the file lacks are appended. The new text is read back
    by the loader first and replaces the file only if the loader takes it (in one rename), so a
    figure the planner would refuse is one line and the file stays as it was."""
    import os
    import shutil
    from pathlib import Path

    from plugins.protocol.errors import ConfigError
    from recipes.plan.cluster import load_cluster

    file = Path(path)
    lines = file.read_text(encoding="utf-8").splitlines()
    left = dict(figures)
    for i, line in enumerate(lines):
        key = line.split(":", 1)[0]
        if key in left and not line.startswith((" ", "#")):
            comment = line[line.index("#"):] if "#" in line else ""
            text = f"{key}: {_figure(left.pop(key))}"
            lines[i] = f"{text}  {comment}" if comment else text
    lines += [f"{key}: {_figure(value)}  # measured by plan.py calibrate=true"
              for key, value in left.items()]
    draft = file.with_name(f".{file.name}.calibrated")
    draft.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copymode(file, draft)  # the file keeps its mode (group-readable, say)
    try:
        load_cluster(draft)
    except ConfigError as error:
        draft.unlink()
        raise ConfigError(f"calibrate=true measured a figure {path} cannot hold; the file is left "
                          f"as it was ({str(error).split(': ', 1)[-1]})") from None
    os.replace(draft, file)


def _figure(value: float) -> str:
    return f"{value:.4g}"


def refuse_gpu_file_without_gpu(cluster: Any, path: str) -> None:
    """A GPU cluster file is calibrated on one of its GPU nodes: this machine's CPU figures
    written into it would price every later plan of those GPUs by a CPU."""
    import torch

    from plugins.protocol.errors import ConfigError

    if cluster.device == "gpu" and not torch.cuda.is_available():
        raise ConfigError(f"cluster={path} describes GPU nodes and this machine has no GPU; "
                          "run calibrate=true on one of its nodes, or calibrate a file with "
                          "device: cpu")


def calibrate_cluster_file(cluster: Any, dtype: str, path: str, cfg: Any = None) -> list[str]:
    """Measure GEMMs and the node's collectives, write the figures into `path`, and say what
    was measured and written. CPU ranks run the recipe's `cluster.threads_per_rank`
    threads each: GEMMs are timed on as many, and the cores they share are written as
    `host_cores`; the recipe's layers give the kernel cost."""
    on_cpu = cluster.device == "cpu"
    refuse_gpu_file_without_gpu(cluster, path)
    refuse_read_only_file(path)  # before minutes of measuring
    threads = cfg.cluster.threads_per_rank if cfg is not None and on_cpu else None
    points = measure_gemms(dtype, threads=threads)
    fraction, half = fit_gemm_model(points, cluster.peak_tflops[dtype])
    ranks = _local_ranks(max(2, cluster.gpus_per_node))
    backend, collectives, kernel = measure_collectives(ranks, kernel_alone=on_cpu)
    latency, bandwidth = fit_collectives(collectives, ranks)
    bare = kernel
    if on_cpu and cfg is not None:
        kernel = layer_kernel_figure(cfg, cluster.peak_tflops[dtype], fraction, half)
    figures = {"gemm_peak_fraction": fraction, "gemm_half_dim": half,
               "intra_node_gb_per_s": bandwidth / 1e9,
               "collective_latency_us": latency * 1e6, "kernel_overhead_us": kernel * 1e6,
               **host_cores_figure(cluster.device)}
    update_cluster_file(path, figures)
    shapes = ", ".join(f"{d}: {t * 1e3:.2f}" for d, t in points)
    sizes = ", ".join(f"{b} B: {s * 1e6:.0f} us" for b, s in collectives)
    return [f"calibrate: {dtype} GEMM [d,d]x[d,d] GFLOP/s by d: {shapes}",
            f"calibrate: {backend} all-reduce over {ranks} ranks by size: {sizes}",
            f"calibrate: a small kernel costs {kernel * 1e6:.0f} us through the recipe's layers "
            f"(a bare 32x32 product: {bare * 1e6:.0f} us)",
            f"calibrate: wrote into {path} (fit against {cluster.name}'s peak "
            f"{cluster.peak_tflops[dtype]:g} TFLOP/s; across nodes not measured here):",
            *(f"{key}: {_figure(value)}" for key, value in figures.items())]


LAYER_COUNTS = (1, 3)  # the model is built twice; the difference is two layers' time


def kernel_cost_from_layers(seconds_by_layers: dict[int, float], gemm_seconds_per_layer: float,
                            kernels_per_layer: int) -> float:
    """Seconds one kernel costs: the step's growth per layer (least squares over the layer
    counts measured) less the layer's GEMMs as the step model prices them, over the kernels
    a layer runs for that micro-batch (never below zero)."""
    xs, ys = list(seconds_by_layers), list(seconds_by_layers.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    per_layer = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    return max(0.0, per_layer - gemm_seconds_per_layer) / kernels_per_layer


def one_micro_batch(cfg: Any, layers: int) -> Any:
    """`cfg`'s model cut to `layers` layers on one rank, one of its micro-batches a step."""
    import dataclasses

    from trainer.one_rank import single_rank

    return single_rank(dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, num_layers=layers)))


def time_layers(one: Any, repeats: int = 12) -> float:
    """Median seconds of forward + backward of one micro-batch through `one`'s model (from
    `one_micro_batch`), on one rank and one thread, after two warm-up passes."""
    import statistics

    import torch

    from plugins.registry import build_plugins
    from trainer.mcore_translation import build_transformer_config
    from trainer.model import build_model_chunks
    from trainer.one_rank import one_process

    torch.set_num_threads(1)
    with one_process(one) as run:
        plugins = build_plugins(run)
        config = plugins.transformer_config(build_transformer_config(run, cpu_initialization=True))
        (model,) = build_model_chunks(run, config, plugins)
        batch, seq = run.train.micro_batch_size, run.model.seq_length
        tokens = torch.randint(0, run.model.vocab_size, (batch, seq))
        positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
        found = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=tokens, position_ids=positions, attention_mask=None,
                  labels=tokens).sum().backward()
            found.append(time.perf_counter() - start)
    return statistics.median(found[2:])


def layer_kernel_figure(cfg: Any, peak_tflops: float, fraction: float, half: float) -> float:
    """`kernel_overhead_us` (in seconds) from the recipe's own layers: what a layer costs one
    CPU rank beyond the GEMMs the step model prices at the calibrated fit."""
    from recipes.plan.steptime import layer_forward_seconds, layer_kernels

    times = {n: time_layers(one_micro_batch(cfg, n)) for n in LAYER_COUNTS}
    products, core = layer_forward_seconds(one_micro_batch(cfg, LAYER_COUNTS[0]),
                                           peak_tflops * 1e12, fraction, half)
    return kernel_cost_from_layers(times, 3 * (products + core), layer_kernels(cfg.train.recompute))


def _local_ranks(wanted: int) -> int:
    """The node's ranks on GPUs when this machine has that many, else `wanted` CPU ranks."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return min(wanted, gpus) if gpus >= 2 else wanted

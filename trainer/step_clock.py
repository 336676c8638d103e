"""Step timing for honest throughput: phase clocks, the profiler window, the run's peak.

A step's phases (data wait, forward-backward, optimizer) are marked with `perf_counter` on CPU
and with CUDA events on GPU (kernels run asynchronously: host time alone would move work
between phases), read when the step's figures are summed (`trainer/step_figures.py`), by then
long recorded. Exposed
communication needs a profiler, which is too costly for every step: it runs only on the steps
`trainer.throughput.profiled_steps` names, which throughput then leaves out. The definitions
themselves live in the torch-free `trainer/throughput.py`. MFU divides by the planner's peak,
the one for the precision the GEMMs compute in (FP8 under an FP8 plugin), so a run's logged
MFU and its plan's are the same fraction of the same number.
"""

from __future__ import annotations

import bisect
import functools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from recipes.plan.cluster import gemm_precision, load_cluster
from trainer.throughput import exposed_time, profiled_steps, union_of

PHASES = ("data_wait", "forward_backward", "optimizer")
# Profiler event names of collectives and point-to-point transfers (gloo, NCCL, c10d wrappers).
_COMM_MARKERS = ("gloo:", "nccl", "c10d::", "record_param_comms")


class StepClock:
    """Marks phase boundaries of one step; `seconds()` gives each phase's duration."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Durations between consecutive marks (on GPU, waits for the last mark's event)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairwise(self.marks)]
        return [b - a for a, b in pairwise(self.marks)]


def start_profiler(index: int, steps_in_process: int, exposed_comm: bool):
    """A running torch profiler when step `index` is in the profiler window (only when the run
    measures exposed communication: `logging.exposed_comm`), else None."""
    if index not in profiled_steps(steps_in_process, exposed_comm=exposed_comm):
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    with _native_stderr_silenced():
        profiler.start()
    return profiler


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """The profiler's C++ side prints start/stop lines (and, without a GPU, a device-count
    error) to stderr on every rank; they would bury the log, so stderr goes to /dev/null."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _is_comm(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _COMM_MARKERS)


def _interval(event) -> tuple[float, float]:
    return event.time_range.start / 1e6, event.time_range.end / 1e6


def comm_and_compute(events: Iterable[Any], on_gpu: bool) -> tuple[list, list]:
    """(communication, compute) intervals in seconds from profiler events.

    On GPU: kernels, NCCL ones being communication. On CPU (gloo runs collectives on its own
    threads while the calling thread waits unrecorded): communication ops on any thread, and
    as compute the `aten::` ops on threads that are not inside a communication op.
    """
    events = list(events)
    if on_gpu:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        comm = [_interval(e) for e in kernels if _is_comm(e.name)]
        return comm, [_interval(e) for e in kernels if not _is_comm(e.name)]
    comm_events = [e for e in events if _is_comm(e.name)]
    by_thread: dict[Any, list] = {}
    for event in comm_events:
        by_thread.setdefault(event.thread, []).append(_interval(event))
    spans = {thread: union_of(intervals) for thread, intervals in by_thread.items()}
    starts = {thread: [a for a, _ in union] for thread, union in spans.items()}

    def nested_in_comm(event) -> bool:  # inside a communication op of its own thread
        if event.thread not in spans:
            return False
        start, end = _interval(event)
        at = bisect.bisect_right(starts[event.thread], start) - 1
        return at >= 0 and end <= spans[event.thread][at][1]

    compute = [_interval(e) for e in events
               if e.name.startswith("aten::") and not nested_in_comm(e)]
    return [_interval(e) for e in comm_events], compute


def stop_profiler(profiler) -> tuple[float, float]:
    """(seconds of this rank's communication not hidden behind its compute, seconds this rank
    computed), in the window."""
    with _native_stderr_silenced():
        profiler.stop()
    comm, compute = comm_and_compute(profiler.events(), torch.cuda.is_available())
    return exposed_time(comm, compute), sum(end - start for start, end in union_of(compute))


def peak_reserved_gib() -> float | None:
    """What the caching allocator took from the device at most (allocated plus its cached,
    fragmented blocks): the figure an out-of-memory compares with. None off GPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 2**30
    return None


def peak_memory_gib() -> float:
    """This rank's peak memory so far: device memory allocated on GPU (what the caching
    allocator handed out, as `torch.cuda.max_memory_allocated` counts it), else the process's
    peak resident set (`ru_maxrss`, KiB on Linux)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@dataclass(frozen=True)
class RunPeak:
    """What MFU divides by: a cluster file's dense TFLOP/s per GPU for the precision the GEMMs
    compute in, the planner's peak (`recipes.plan.cluster.gemm_precision`), or None and why."""

    precision: str  # the cluster file's `peak_tflops` key (fp8 when an FP8 plugin is on)
    tflops: float | None
    unknown: str | None = None  # why there is no peak (None when there is one)


def run_peak(cfg: Any) -> RunPeak:
    """The run's peak from the cluster file the config names (`cluster.spec`). None without a
    file, or where the file has no peak for the GEMMs' precision (FP4 on GPUs before
    Blackwell): MFU is then unknown rather than guessed, and the run goes on (the planner
    refuses such a file; a run only reports)."""
    precision, spec = gemm_precision(cfg), cfg.cluster.spec
    if not spec:
        return RunPeak(precision, None, "no cluster file named "
                                        "(cluster.spec=conf/cluster/<file>.yaml)")
    tflops = cluster_peak_tflops(str(spec), precision)
    if tflops is None:
        return RunPeak(precision, None, f"{spec} gives no peak_tflops.{precision} for this "
                                        f"run's {precision} GEMMs")
    return RunPeak(precision, tflops)


@functools.lru_cache(maxsize=8)
def cluster_peak_tflops(path: str, precision: str) -> float | None:
    """A cluster file's peak for one precision (read once per process)."""
    return load_cluster(path).peak_tflops.get(precision)

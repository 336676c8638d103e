"""Honest throughput: what counts as a loss token and a comparable second, and which steps
of a run are measured.

Torch-free, so the trainer, the scaling harness and the tests share one definition:

- effective tokens/s: loss-contributing tokens of whole optimizer steps, each counted once
  (summed over DP replicas and CP chunks, never again for the TP/PP ranks that compute the same
  token; padding and masked positions carry no loss and are not counted), divided by the wall
  time of those whole steps after warm-up, outside the profiled steps (a step's own
  `tokens_per_s` is the same over a one-step window);
- tokens seen (the summary's `tokens_seen`, and per source `source_tokens`) are another count:
  samples x sequence length of the batches taken, padding included; no rate divides them;
- which steps count: the first `WARMUP_STEPS` of a process (allocator, first collectives) and
  the `PROFILE_STEPS` after them that the trainer runs under torch.profiler when the run
  measures exposed communication (`logging.exposed_comm`) are left out. torch runs one profiler
  at a time, so a plugin that profiles steps must avoid those: `check_profile_windows` refuses
  an overlap before launch, and `RunStart.profiled_steps` tells plugins at run time;
- model FLOPs and MFU: the one definition in `recipes/plan/flops.py`, shared with the planner,
  over the sequences each step trained: a full row of n tokens is one sequence (n tokens, n²),
  a packed or inter-document row is its documents (their tokens, the sum of their squares:
  attention stays inside a document), counted once per DP replica like loss tokens; MFU
  divides by the planner's peak, the cluster file's for the precision the GEMMs compute in
  (`recipes.plan.cluster.gemm_precision`: FP8 under an FP8 plugin);
- scaling efficiency against the smallest size that runs the model: T_G / ((G/G0) * T_G0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from plugins.protocol.packed_batch import document_lengths

SECONDS_PER_HOUR = 3600.0
# Steps at the start of a process excluded from throughput (allocator, first collectives).
WARMUP_STEPS = 1
# Steps right after the warm-up that the trainer profiles to measure exposed communication
# when `logging.exposed_comm` asks for it; throughput leaves them out.
PROFILE_STEPS = 2


# --- which steps count --------------------------------------------------------------------

def profiled_steps(steps_in_process: int, *, exposed_comm: bool) -> range:
    """Indices (0-based, from this process's first step) the trainer runs under torch.profiler:
    with `exposed_comm` (the run's `logging.exposed_comm`), the PROFILE_STEPS after the
    warm-up, only when at least as many measured steps remain; none otherwise."""
    if not exposed_comm or steps_in_process < WARMUP_STEPS + 2 * PROFILE_STEPS:
        return range(0)
    return range(WARMUP_STEPS, WARMUP_STEPS + PROFILE_STEPS)


def trainer_profiled_steps(start_step: int, total_steps: int, exposed_comm: bool) -> frozenset:
    """Step numbers (1-based, as logged) the trainer profiles in a process that trains from
    `start_step` to `total_steps`."""
    return frozenset(start_step + 1 + index for index in
                     profiled_steps(total_steps - start_step, exposed_comm=exposed_comm))


def check_profile_windows(cfg: Any) -> str | None:
    """No plugin profiles a step the trainer profiles itself (torch runs one profiler at a
    time: a second one started inside the first leaves the first with no events)."""
    own = trainer_profiled_steps(0, cfg.train.train_iters, cfg.logging.exposed_comm)
    for name, config in cfg.plugins.configs():
        window = config.profile_window(cfg)
        if window is None:
            continue
        clash = sorted(step for step in own if window.first <= step <= window.last)
        if clash:
            return (f"plugins.{name} profiles steps {window.first}-{window.last}, which overlaps "
                    f"steps {clash[0]}-{clash[-1]} that the trainer profiles itself to measure "
                    "exposed communication (logging.exposed_comm=true; torch runs one profiler "
                    f"at a time); set {window.start_key}={max(own) + 1} or later, or "
                    "logging.exposed_comm=false")
    return None


# Rules of how the trainer runs, beside the core rules and each plugin's own (checked by the
# entry pipeline and the launcher before anything starts).
RUN_RULES = (check_profile_windows,)


def is_measured(index: int, steps_in_process: int, *, exposed_comm: bool) -> bool:
    """Whether step `index` of this process enters throughput: after warm-up, not profiled
    (`exposed_comm`: the run profiles steps to measure exposed communication)."""
    return index >= WARMUP_STEPS and index not in profiled_steps(
        steps_in_process, exposed_comm=exposed_comm)


# --- which tokens count -------------------------------------------------------------------

def counts_loss_tokens(tp_rank: int, last_pipeline_stage: bool) -> bool:
    """Whether this rank's loss tokens enter the global count: only the last pipeline stage
    holds losses, and of the TP ranks that share a token only TP rank 0 reports it. Every DP
    replica and every CP chunk has its own TP-rank-0 last-stage rank, so those add up."""
    return last_pipeline_stage and tp_rank == 0


def counts_trained_rows(tp_rank: int, cp_rank: int, last_pipeline_stage: bool) -> bool:
    """Whether this rank's micro-batches enter the step's model FLOPs: every rank of a DP
    replica takes the same rows (whole, before any CP split), so one rank per replica reports
    them, the one that also reports its loss tokens, at CP rank 0."""
    return counts_loss_tokens(tp_rank, last_pipeline_stage) and cp_rank == 0


def trained_sequences(microbatches: Iterable[dict]) -> tuple[int, int]:
    """(tokens, sum of squared sequence lengths) of the rows in `microbatches`, as
    `recipes.plan.flops.training_flops` takes them: a row without `cu_seqlens` is one sequence
    of its full length; a packed row is its documents (padding is not useful work). Read on
    the host from the batches as taken, before they move to a device: no synchronisation."""
    tokens = squares = 0
    for batch in microbatches:
        if "cu_seqlens" in batch:
            lengths = document_lengths(batch)
            tokens += int(lengths.sum())
            squares += int(np.square(lengths).sum())
        else:
            rows, length = batch["tokens"].shape[:2]
            tokens += rows * length
            squares += rows * length * length
    return tokens, squares


def tokens_per_second(steps: Sequence[tuple[float, int]]) -> float:
    """Tokens over wall time of whole steps: sum of tokens / sum of seconds (not a mean of
    per-step rates, which would weight a fast step like a slow one)."""
    seconds = sum(t for t, _ in steps)
    return sum(tokens for _, tokens in steps) / seconds if seconds > 0 else 0.0


def measured_throughput(steps: Sequence[tuple[float, int]], *, exposed_comm: bool) -> float:
    """Effective tokens/s over a process's (seconds, loss tokens) per step, measured steps
    only; with too few steps for a warm-up, every step counts."""
    kept = [step for index, step in enumerate(steps)
            if is_measured(index, len(steps), exposed_comm=exposed_comm)]
    return tokens_per_second(kept or list(steps))


# --- scaling ------------------------------------------------------------------------------

def scaling_efficiency(tokens_per_s: float, gpus: int, base_tokens_per_s: float,
                       base_gpus: int) -> float:
    """T_G / ((G / G0) * T_G0): 1.0 is perfect linear scaling from the base size."""
    return tokens_per_s / ((gpus / base_gpus) * base_tokens_per_s)


def hours_for_tokens(token_budget: float, tokens_per_s: float) -> float:
    """Pure training time for a token budget (no evaluation, checkpoints or failures)."""
    return token_budget / tokens_per_s / SECONDS_PER_HOUR


def gpu_hours_for_tokens(token_budget: float, tokens_per_s: float, gpus: int) -> float:
    return hours_for_tokens(token_budget, tokens_per_s) * gpus


# --- exposed communication ------------------------------------------------------------------

def union_of(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted disjoint intervals covering the same time as `intervals`."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def exposed_time(communication: Iterable[tuple[float, float]],
                 compute: Iterable[tuple[float, float]]) -> float:
    """Time some communication runs while no computation does: the union of communication
    intervals minus its overlap with the union of compute intervals. Communication hidden
    behind compute costs nothing; only the rest adds to the step."""
    comm, busy = union_of(communication), union_of(compute)
    total = sum(end - start for start, end in comm)
    for c_start, c_end in comm:
        for b_start, b_end in busy:
            total -= max(0.0, min(c_end, b_end) - max(c_start, b_start))
    return total

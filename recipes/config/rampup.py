"""Batch ramp-up: `train.rampup_batch_size=[start, increment, samples]`, Megatron-LM's meaning.

The global batch starts at `start` and grows by `increment` in equal shares of the first
`samples` consumed samples until it reaches `train.global_batch_size` (Megatron-LM's former
`RampupBatchsizeNumMicroBatchesCalculator`: batch = start + floor(consumed / per_increment) x
increment). Megatron Core 0.19.2 has deprecated that calculator and ignores `rampup_batch_size`
(`num_microbatches_calculator.py:79-104`); its `StepBatchsizeNumMicroBatchesCalculator` takes a
schedule of (threshold, batch) pairs instead, so this module writes the ramp as that schedule,
which the trainer hands to Megatron's calculator and the planner walks. The batch is a function
of consumed samples only, so a resume in the middle of the ramp continues it exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipes.config.schema import RunConfig

Schedule = tuple[tuple[int, int], ...]  # (consumed samples from which it applies, global batch)


def ramp_schedule(cfg: RunConfig) -> Schedule | None:
    """The ramp as (threshold, batch) pairs from sample 0 to the full batch; None: no ramp."""
    ramp = cfg.train.rampup_batch_size
    if ramp is None:
        return None
    start, increment, samples = ramp
    increments = (cfg.train.global_batch_size - start) // increment
    if increments == 0:
        return ((0, cfg.train.global_batch_size),)
    per_increment = samples / increments
    return tuple((math.ceil(k * per_increment), start + k * increment)
                 for k in range(increments + 1))


def megatron_schedule(schedule: Schedule) -> str:
    """Megatron Core's `step_batch_size_schedule` text: "THRESHOLD:BATCH ..." in samples."""
    return " ".join(f"{threshold}:{batch}" for threshold, batch in schedule)


def batch_at(schedule: Schedule, consumed: int) -> int:
    """The global batch of the step that starts after `consumed` samples."""
    return next(batch for threshold, batch in reversed(schedule) if consumed >= threshold)


def samples_after(schedule: Schedule, steps: int) -> int:
    """Samples consumed after `steps` steps of the ramp (and the full batch after it), one
    stretch of equal batches at a time."""
    consumed, done = 0, 0
    thresholds = [threshold for threshold, _ in schedule]
    while done < steps:
        batch = batch_at(schedule, consumed)
        following = [t for t in thresholds if t > consumed]
        count = steps - done
        if following:
            count = min(count, math.ceil((following[0] - consumed) / batch))
        consumed, done = consumed + count * batch, done + count
    return consumed


def ramp_steps(schedule: Schedule) -> int:
    """Steps until the batch is full."""
    consumed, steps = 0, 0
    for (_, batch), (following, _) in zip(schedule, schedule[1:], strict=False):
        if consumed < following:
            count = math.ceil((following - consumed) / batch)
            consumed, steps = consumed + count * batch, steps + count
    return steps


# --- rules ---------------------------------------------------------------------------------

def check_rampup_shape(cfg: RunConfig) -> str | None:
    """Three positive integers, the start no larger than the full batch, whole increments."""
    ramp, gbs = cfg.train.rampup_batch_size, cfg.train.global_batch_size
    if ramp is None:
        return None
    if len(ramp) != 3 or min(ramp) < 1:
        return (f"train.rampup_batch_size={list(ramp)} must be [start, increment, samples], "
                "three positive integers, e.g. train.rampup_batch_size=[32,32,1000]")
    start, increment, _ = ramp
    if start > gbs or (gbs - start) % increment:
        return (f"train.rampup_batch_size={list(ramp)}: from {start} in steps of {increment} "
                f"the batch never reaches train.global_batch_size={gbs}; choose start <= {gbs} "
                f"and an increment that divides {gbs - start}")
    return None


def check_rampup_divisible(cfg: RunConfig) -> str | None:
    """Every batch of the ramp splits into whole micro-batches on every DP rank."""
    if check_rampup_shape(cfg) is not None or cfg.train.rampup_batch_size is None:
        return None
    unit = cfg.train.micro_batch_size * cfg.layout.data_parallel
    for _, batch in ramp_schedule(cfg):
        if batch % unit:
            return (f"train.rampup_batch_size={list(cfg.train.rampup_batch_size)} reaches a "
                    f"global batch of {batch}, not divisible by train.micro_batch_size x DP = "
                    f"{unit}; make start and increment multiples of {unit}")
    return None


def check_rampup_samples(cfg: RunConfig) -> str | None:
    """Each increment lasts at least one sample (Megatron's thresholds strictly rise)."""
    ramp = cfg.train.rampup_batch_size
    if ramp is None or check_rampup_shape(cfg) is not None:
        return None
    increments = (cfg.train.global_batch_size - ramp[0]) // ramp[1]
    if ramp[2] < increments:
        return (f"train.rampup_batch_size={list(ramp)} ramps {increments} times over "
                f"{ramp[2]} samples; give the ramp at least {increments} samples")
    return None


def check_rampup_with_phases(cfg: RunConfig) -> str | None:
    """One source of the batch per step: the ramp, or phases' batches, not both."""
    if cfg.train.rampup_batch_size is None:
        return None
    for index, phase in enumerate(cfg.phases):
        if phase.global_batch_size is not None:
            return (f"phases[{index}] ({phase.name}) sets global_batch_size while "
                    "train.rampup_batch_size ramps the batch; use one of them")
    return None


RAMPUP_RULES = (check_rampup_shape, check_rampup_divisible, check_rampup_samples,
                check_rampup_with_phases)

"""Batch ramp-up: the ramp as Megatron Core's step schedule, equal to Megatron-LM's ramp-up
formula at every consumed sample, walked in steps; each rule fires alone; the planner shows
the ramp's steps."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.config.rampup import (
    batch_at,
    megatron_schedule,
    ramp_schedule,
    ramp_steps,
    samples_after,
)
from recipes.config.validation import failing_rules, validate
from recipes.registry import get_recipe

RAMP = ["train.global_batch_size=16", "train.rampup_batch_size=[4,4,24]"]


def _cfg(*overrides: str, recipe: str = "tiny_dp2"):
    return apply_overrides(get_recipe(recipe), list(overrides))


def _megatron_lm_batch(start: int, increment: int, samples: int, full: int, consumed: int):
    """Megatron-LM's former RampupBatchsizeNumMicroBatchesCalculator.update."""
    if consumed > samples:
        return full
    per_increment = samples / ((full - start) // increment)
    return start + int(consumed / per_increment) * increment


@pytest.mark.parametrize("ramp", [(4, 4, 24), (384, 384, 5_859_375), (8, 8, 1000)])
def test_schedule_gives_megatron_lms_batch_at_every_sample(ramp) -> None:
    full = 1152 if ramp[0] == 384 else 16 if ramp[0] == 4 else 64
    cfg = apply_overrides(get_recipe("tiny_dp1"), [
        f"train.global_batch_size={full}", f"train.rampup_batch_size=[{','.join(map(str, ramp))}]"])
    schedule = ramp_schedule(cfg)
    probes = sorted({*range(0, 200), *(t + d for t, _ in schedule for d in (-1, 0, 1))} - {-1})
    for consumed in probes:
        assert batch_at(schedule, consumed) == _megatron_lm_batch(*ramp, full, consumed), consumed


def test_megatron_cores_calculator_follows_the_schedule() -> None:
    from megatron.core.num_microbatches_calculator import StepBatchsizeNumMicroBatchesCalculator

    schedule = ramp_schedule(_cfg(*RAMP))
    calculator = StepBatchsizeNumMicroBatchesCalculator(
        micro_batch_size=2, data_parallel_size=2, decrease_batch_size_if_needed=False, rank=0,
        schedule=megatron_schedule(schedule))
    for consumed in range(0, 40):
        calculator.update(consumed, consistency_check=True)
        assert calculator.get_current_global_batch_size() == batch_at(schedule, consumed)
        assert calculator.get() == batch_at(schedule, consumed) // 4  # micro-batches per rank


def test_walking_the_ramp_in_steps() -> None:
    schedule = ramp_schedule(_cfg(*RAMP))
    assert schedule == ((0, 4), (8, 8), (16, 12), (24, 16))
    assert [samples_after(schedule, n) for n in range(7)] == [0, 4, 8, 16, 28, 44, 60]
    assert ramp_steps(schedule) == 4


def test_the_schedule_counts_the_samples_the_ramp_takes() -> None:
    from recipes.config.phases import schedule_samples

    cfg = _cfg(*RAMP, "train.train_iters=6", "scheduler.warmup_iters=3")
    s = schedule_samples(cfg)
    assert (s.warmup, s.decay) == (16, 60)


def test_planner_shows_the_ramp_and_its_extra_steps() -> None:
    from recipes.plan.batch import batch_plan

    cfg = _cfg(*RAMP)
    plan = batch_plan(cfg, peak_tflops=100.0, mfu=0.5, token_budget=60 * 128)
    assert (plan.ramp_steps, plan.ramp_samples) == (4, 28)
    assert plan.steps == 4 + 2  # 28 ramp samples, then 32 more at the full 16
    flat = batch_plan(_cfg("train.global_batch_size=16"), 100.0, 0.5, 60 * 128)
    assert flat.steps == 4 and plan.gpu_hours == pytest.approx(flat.gpu_hours * 60 / 64)


RAMPUP_RULE_CASES = [
    ("check_rampup_shape", ["train.rampup_batch_size=[4,4]"],
     "train.rampup_batch_size=[4, 4] must be [start, increment, samples], three positive "
     "integers"),
    ("check_rampup_shape", ["train.rampup_batch_size=[4,5,24]", "train.global_batch_size=16"],
     "from 4 in steps of 5 the batch never reaches train.global_batch_size=16"),
    ("check_rampup_divisible", ["train.rampup_batch_size=[2,2,24]", "train.global_batch_size=16"],
     "reaches a global batch of 2, not divisible by train.micro_batch_size x DP = 4"),
    ("check_rampup_samples", ["train.rampup_batch_size=[4,4,2]", "train.global_batch_size=16"],
     "ramps 3 times over 2 samples; give the ramp at least 3 samples"),
    ("check_rampup_with_phases", [*RAMP, "phases=[{name: a, end_step: 150}, "
                                  "{name: b, end_step: 300, global_batch_size: 8}]"],
     "phases[1] (b) sets global_batch_size while train.rampup_batch_size ramps the batch"),
]


@pytest.mark.parametrize(("rule", "overrides", "message"), RAMPUP_RULE_CASES,
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in RAMPUP_RULE_CASES])
def test_rampup_rule_fires_alone_with_its_message(rule, overrides, message) -> None:
    cfg = _cfg(*overrides)
    assert failing_rules(cfg) == [rule]
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)

"""Batch arithmetic: global batch = micro-batch x DP x accumulation, and what a token budget
costs in steps and GPU-hours.

Only data-parallel replicas read different samples: TP, PP and CP ranks share their replica's
micro-batch, so multiplying them in would overstate the batch. GPU-hours come from the model's
training FLOPs per token (`recipes/plan/flops.py`, the definition the trainer's MFU uses too:
the matrix multiplies a token runs, routed experts only, plus causal attention) at a stated
share of the cluster's peak (model FLOPs utilisation), not from a measured step. A batch
ramp-up (`train.rampup_batch_size`) is walked stage by stage: its steps are smaller, so a budget
takes more steps, while GPU-hours at a fixed MFU follow the tokens trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.config.rampup import ramp_schedule, samples_after
from recipes.config.rampup import ramp_steps as count_ramp_steps
from recipes.plan.flops import model_flops_per_token


def global_batch(micro_batch: int, data_parallel: int, accumulation: int) -> int:
    return micro_batch * data_parallel * accumulation


def ceil_div(numerator: int, denominator: int) -> int:
    """Steps a budget takes, in integers: `math.ceil(a / b)` goes through a float, which for a
    budget beyond 2**53 tokens (`tokens=1e30`) is off by many steps."""
    return -(-numerator // denominator)


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int
    data_parallel: int
    accumulation: int
    global_batch: int
    tokens_per_step: int
    token_budget: int | None
    steps: int | None
    flops_per_token: float
    step_seconds: float | None  # at `mfu` of the cluster's peak
    gpu_hours: float | None
    mfu: float
    # With train.rampup_batch_size: the ramp's (threshold samples, batch) stages, the steps it
    # takes and the samples it consumes; a token budget then costs more, smaller steps.
    ramp: tuple[tuple[int, int], ...] | None = None
    ramp_steps: int | None = None
    ramp_samples: int | None = None


def batch_plan(cfg: Any, peak_tflops: float | None, mfu: float,
               token_budget: int | None) -> BatchPlan:
    layout = cfg.layout
    gb = global_batch(layout.micro_batch, layout.data_parallel, layout.microbatches)
    tokens = gb * cfg.model.seq_length
    per_token = model_flops_per_token(cfg)
    step_s = None
    if peak_tflops:
        step_s = per_token * tokens / (layout.world_size * peak_tflops * 1e12 * mfu)
    ramp = ramp_schedule(cfg)
    ramp_steps = ramp_samples = None
    if ramp is not None:
        ramp_steps = count_ramp_steps(ramp)
        ramp_samples = samples_after(ramp, ramp_steps)
    steps, trained = None, None  # steps for the budget and the tokens they train on
    if token_budget:
        ramp_tokens = (ramp_samples or 0) * cfg.model.seq_length
        rest = ceil_div(max(0, token_budget - ramp_tokens), tokens)
        steps, trained = (ramp_steps or 0) + rest, ramp_tokens + rest * tokens
    hours = None  # at a fixed MFU a step's time follows its tokens, so hours follow tokens
    if trained and peak_tflops:
        hours = per_token * trained / (peak_tflops * 1e12 * mfu) / 3600
    return BatchPlan(layout.micro_batch, layout.data_parallel, layout.microbatches, gb, tokens,
                     token_budget, steps, per_token, step_s, hours, mfu, ramp, ramp_steps,
                     ramp_samples)

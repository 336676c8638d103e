"""Batch arithmetic: global batch = micro-batch x DP x accumulation, and what a token budget
costs in steps and GPU-hours.

Only data-parallel replicas read different samples: TP, PP and CP ranks share their replica's
micro-batch, so multiplying them in would overstate the batch. GPU-hours come from the model's
training FLOPs per token (`recipes/plan/flops.py`, the definition the trainer's MFU uses too:
the matrix multiplies a token runs, routed experts only, plus causal attention) at a stated
share of the cluster's peak (model FLOPs utilisation), not from a measured step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recipes.plan.flops import model_flops_per_token


def global_batch(micro_batch: int, data_parallel: int, accumulation: int) -> int:
    return micro_batch * data_parallel * accumulation


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


def batch_plan(cfg: Any, peak_tflops: float | None, mfu: float,
               token_budget: int | None) -> BatchPlan:
    layout = cfg.layout
    gb = global_batch(layout.micro_batch, layout.data_parallel, layout.microbatches)
    tokens = gb * cfg.model.seq_length
    per_token = model_flops_per_token(cfg)
    step_s = None
    if peak_tflops:
        step_s = per_token * tokens / (layout.world_size * peak_tflops * 1e12 * mfu)
    steps = math.ceil(token_budget / tokens) if token_budget else None
    hours = steps * step_s * layout.world_size / 3600 if steps and step_s else None
    return BatchPlan(layout.micro_batch, layout.data_parallel, layout.microbatches, gb, tokens,
                     token_budget, steps, per_token, step_s, hours, mfu)

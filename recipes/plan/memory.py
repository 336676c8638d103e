"""Model-state bytes on one rank: weights, gradients, FP32 master weights and Adam moments.

What each parameter costs depends on the precision (what the weights and gradient buffers are
stored in, whether an FP32 master copy exists) and on what data parallel shards: nothing
(plain DDP), the optimizer state (Megatron's distributed optimizer, ZeRO-1; Megatron FSDP's
`optim`), also gradients (`optim_grads`, ZeRO-2), also weights (`optim_grads_params`, ZeRO-3);
optimizer CPU offload moves a share of master weights and moments off the GPU (with an FP32
copy of their gradients). Dense weights shard over
DP x CP (Megatron reduces dense gradients over that group), expert weights over expert-DP.
The byte table: BF16 weights and gradients, FP32 master, two FP32 moments (16 bytes a parameter);
FP8 parameters hold their layers' GEMM weights in one byte instead (`gemm_weights.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from plugins.protocol.errors import ConfigError
from recipes.plan.gemm_weights import weight_bytes_saved
from recipes.plan.params import ParamCount

Sharding = Literal["none", "dist_opt", "optim", "optim_grads", "optim_grads_params"]
SHARDINGS: tuple[str, ...] = ("none", "dist_opt", "optim", "optim_grads", "optim_grads_params")
# What each sharding splits over data parallel: (optimizer state, gradients, weights).
_SHARDED: dict[str, tuple[bool, bool, bool]] = {
    "none": (False, False, False),
    "dist_opt": (True, False, False),
    "optim": (True, False, False),
    "optim_grads": (True, True, False),
    "optim_grads_params": (True, True, True),
}
_SIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class StateBytes:
    """Bytes each parameter costs, before sharding."""

    weight: int  # the model's copy (what forward reads)
    grad: int  # the gradient buffer
    master: int  # FP32 master copy kept by the optimizer (0 when weights are FP32)
    moments: int = 8  # Adam's two FP32 moments

    @property
    def total(self) -> int:
        return self.weight + self.grad + self.master + self.moments


def state_bytes(dtype: str, *, grad_in_fp32: bool, fp8_weights: bool = False) -> StateBytes:
    """Per-parameter bytes for `precision.dtype` (fp32/bf16/fp16); FP8 training keeps BF16
    weights unless `fp8_weights` (Transformer Engine FP8 parameters, one byte each)."""
    weight = 1 if fp8_weights else _SIZE[dtype]
    grad = 4 if (grad_in_fp32 or dtype == "fp32") else _SIZE[dtype]
    master = 0 if dtype == "fp32" else 4
    return StateBytes(weight=weight, grad=grad, master=master)


def state_bytes_of(cfg: Any, fp8_weights: bool = False) -> StateBytes:
    return state_bytes(cfg.precision.dtype, grad_in_fp32=cfg.precision.grad_reduce_in_fp32,
                       fp8_weights=fp8_weights)


def sharding_of(cfg: Any, override: str | None = None) -> str:
    """The run's sharding: the distributed optimizer when `optimizer.distributed`, else none;
    the planner's `sharding=` option asks about the others."""
    if override is None:
        fsdp = getattr(cfg.optimizer, "fsdp", "none")
        if fsdp != "none":
            return fsdp  # Megatron FSDP's sharding strategy
        return "dist_opt" if cfg.optimizer.distributed else "none"
    if override not in SHARDINGS:
        raise ConfigError(f"sharding={override} is not known; use one of {', '.join(SHARDINGS)}")
    return override


@dataclass(frozen=True)
class ModelState:
    """Bytes of each model-state item on one rank."""

    weights: float
    grads: float
    master: float
    moments: float
    # optimizer state moved to CPU memory (not on the GPU), with its FP32 gradient copies
    offloaded: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.master + self.moments

    def items(self) -> dict[str, float]:
        return {"weights": self.weights, "gradients": self.grads,
                "fp32 master weights": self.master, "Adam moments": self.moments}


def _sharded(params: float, shards: int, bytes_per: int, split: bool) -> float:
    return params * bytes_per / (shards if split else 1)


# Optimizer CPU offload (Megatron's hybrid-device optimizer): the offloaded share of the FP32
# master weights and Adam moments lives in CPU memory, with an FP32 copy of each of its
# gradients that the CPU Adam steps from (optimizer/cpu_offloading/hybrid_optimizer.py:105-114).
OFFLOADED_GRAD_BYTES = 4


def offload_share(cfg: Any, planner_offload: bool = False) -> float:
    """The share of the optimizer state in CPU memory: the run's `optimizer.offload_fraction`
    when it offloads, all of it when the planner's `offload=true` asks, else none."""
    if getattr(cfg.optimizer, "cpu_offload", False):
        return cfg.optimizer.offload_fraction
    return 1.0 if planner_offload else 0.0


def offload_option_note(cfg: Any, planner_offload: bool) -> str | None:
    """The planner's `offload=true` asks about moving all of the optimizer state; a run that
    offloads already is priced at its own `optimizer.offload_fraction` (`offload_share`, as
    docs/planner.md says), so when that is a part the plan says the option changed nothing."""
    o = cfg.optimizer
    if not planner_offload or not getattr(o, "cpu_offload", False) or o.offload_fraction >= 1:
        return None
    return (f"offload=true: priced at the run's own optimizer.offload_fraction="
            f"{o.offload_fraction:g} (its optimizer.cpu_offload=true); add "
            "optimizer.offload_fraction=1.0 to price all of the optimizer state in CPU memory")


def model_state(params: float, shards: int, per: StateBytes, sharding: str,
                offload: float = 0.0) -> ModelState:
    """Model state of `params` parameters whose data-parallel group has `shards` ranks; the
    share `offload` of the optimizer state (master weights, moments) in CPU memory."""
    optim, grads, weights = _SHARDED[sharding]
    master = _sharded(params, shards, per.master, optim)
    moments = _sharded(params, shards, per.moments, optim)
    host_grads = _sharded(params, shards, OFFLOADED_GRAD_BYTES, optim)
    kept = 1.0 - offload
    return ModelState(
        weights=_sharded(params, shards, per.weight, weights),
        grads=_sharded(params, shards, per.grad, grads),
        master=master * kept,
        moments=moments * kept,
        offloaded=(master + moments + host_grads) * offload,
    )


def add(a: ModelState, b: ModelState) -> ModelState:
    return ModelState(a.weights + b.weights, a.grads + b.grads, a.master + b.master,
                      a.moments + b.moments, a.offloaded + b.offloaded)


# Adam's optimizer state as a checkpoint stores it: an FP32 copy of each parameter ("param")
# and its two FP32 moments, whatever the training precision.
OPTIMIZER_STATE_BYTES = 12


def save_host_bytes(cfg: Any, count: ParamCount, per: StateBytes, sharding: str) -> float:
    """CPU memory one rank holds while a checkpoint is written: the writer copies what this
    rank writes to host memory first (DP replicas split the replicated tensors:
    fully parallel save), and the distributed optimizer's `fully_reshardable` format first
    gathers the whole fp32 state of this rank's TP x PP share onto every rank
    (`optimizer/distrib_optimizer.py:1729-1738`, `get_parameter_state_dp_zero`);
    `dp_reshardable` writes each rank's own slice. Weights are copied at the run's dtype,
    FP8 ones too (`fp8_weights_of`): the writer dequantizes a quantized GPU tensor before its
    copy to the host (`dist_checkpointing/strategies/filesystem_async.py:146-161`)."""
    layout = cfg.layout
    dense_dp, expert_dp = layout.data_parallel * layout.context, layout.expert_data_parallel
    weights = _SIZE[cfg.precision.dtype] * (count.dense / dense_dp + count.expert / expert_dp)
    own_state = OPTIMIZER_STATE_BYTES * (count.dense / dense_dp + count.expert / expert_dp)
    gathered = sharding == "dist_opt" and cfg.checkpoint.optimizer_format == "fully_reshardable"
    state = OPTIMIZER_STATE_BYTES * (count.dense + count.expert) if gathered else own_state
    return weights + state


def fp8_weights_of(cfg: Any, count: ParamCount, low: ParamCount | None,
                   per: StateBytes) -> tuple[ParamCount, float]:
    """Which of a stage's parameters (one rank's, before sharding) are held below the run's
    dtype on the GPU, and the bytes of each: the one answer for the planner's `fp8_weights=true`
    (every weight at one byte, `state_bytes`, as docs/planner.md defines the what-if) and a
    run's own FP8 or NVFP4 parameters (`plugins.fp8.param_gather`: the GEMM weights outside the
    BF16 ends, at the plugin's bytes, `gemm_weights.py`); none otherwise."""
    if per.weight < _SIZE[cfg.precision.dtype]:  # the planner's fp8_weights=true
        return count, per.weight
    stored = cfg.plugins.gemm_weights(cfg)
    if stored is None or low is None:
        return ParamCount(), per.weight
    return low, stored.bytes_per_weight


def rank_model_state(cfg: Any, count: ParamCount, per: StateBytes, sharding: str,
                     offload: float = 0.0, low: ParamCount | None = None) -> ModelState:
    """One rank's model state: dense weights shard over DP x CP, experts over expert-DP; `low`:
    the GEMM weights a plugin stores in fewer bytes (FP8 parameters, `gemm_weights.py`)."""
    layout = cfg.layout
    dense = model_state(count.dense, layout.data_parallel * layout.context, per, sharding,
                        offload)
    expert = model_state(count.expert, layout.expert_data_parallel, per, sharding, offload)
    state = add(dense, expert)
    fp8, fp8_bytes = fp8_weights_of(cfg, count, low, per)
    if fp8_bytes >= per.weight:  # none below what the state above priced them at
        return state
    saved = weight_bytes_saved(cfg, fp8, per.weight, _SHARDED[sharding][2])
    return dataclasses.replace(state, weights=state.weights - saved)

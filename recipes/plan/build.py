"""Assemble one plan: for each pipeline stage its parameters, model state, activations, peak
and traffic; then placement, bubble and batch. Every figure comes from the component modules;
this file only puts them together for the worst rank of each stage (all ranks of a stage hold
the same sizes: TP, CP, DP and EP ranks differ in which slice they hold, not in its size).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from recipes.plan.activations import StageActivations, fused_norms, stage_activations
from recipes.plan.batch import BatchPlan, batch_plan
from recipes.plan.cluster import ClusterSpec, gemm_peak_tflops
from recipes.plan.comm import Traffic, crossing_kinds, stage_traffic
from recipes.plan.gemm_weights import stage_low_precision_weights
from recipes.plan.memory import (
    ModelState,
    offload_share,
    rank_model_state,
    save_host_bytes,
    sharding_of,
    state_bytes_of,
)
from recipes.plan.params import (
    ParamCount,
    model_parameters,
    stage_kinds,
    stage_layer_counts,
    stage_params,
)
from recipes.plan.placement import GroupSummary, drawing, group_summaries
from recipes.plan.schedule import Bubble, bubble, in_flight_1f1b, in_flight_all_forward
from recipes.plan.spanning import spanning_warnings


@dataclass(frozen=True)
class PlanOptions:
    """What the recipe does not say: the planner's own choices (scripts/plan.py options)."""

    sharding: str | None = None  # None: the run's (distributed optimizer or none)
    offload: bool = False  # optimizer state in CPU memory
    attention: str | None = None  # None: the cluster's kernel
    fp8_weights: bool = False  # FP8 training that keeps FP8 (not BF16) weights
    token_budget: int | None = None  # tokens to train on, for steps and GPU-hours
    mfu: float = 0.4  # share of peak FLOP/s a step reaches, for GPU-hours
    listed_groups: int | None = None  # groups written out per kind (None: all)


@dataclass(frozen=True)
class StagePlan:
    stage: int
    layers: list[int]  # per virtual chunk
    params: ParamCount
    state: ModelState
    activations: StageActivations
    traffic: list[Traffic]
    save_host: float = 0.0  # CPU memory one rank holds while a checkpoint is written

    @property
    def peak(self) -> float:
        return self.state.total + self.activations.total

    def contributors(self) -> list[tuple[str, float]]:
        """What the peak is made of, largest first."""
        a = self.activations
        items = {**self.state.items(),
                 f"activations ({a.layers} layers x {a.in_flight:g} micro-batches)":
                     a.layers_total,
                 "embedding inputs": a.embedding,
                 "CUDA graphs' static buffers": a.cuda_graphs, **backward_phase(a)}
        return sorted(((k, v) for k, v in items.items() if v > 0), key=lambda kv: -kv[1])


def backward_phase(a: StageActivations) -> dict[str, float]:
    """The phase of the backward that sets the peak (`StageActivations.total`): full
    recompute's decoder block rebuild, or the heads' (the main head's logits and loss, the MTP
    depths, and one depth rebuilt beside them); the two never coexist."""
    if a.recompute_working > a.heads:
        return {"full-recompute block rebuilt (decoder's phase)": a.recompute_working}
    return {"logits and loss": a.output, "MTP depths": a.mtp,
            "full-recompute MTP depth rebuilt (heads' phase)": a.mtp_rebuild}


@dataclass(frozen=True)
class Plan:
    cfg: Any
    cluster: ClusterSpec
    options: PlanOptions
    sharding: str
    attention: str
    parameters: int
    stages: list[StagePlan]
    groups: list[GroupSummary]
    drawing: list[str]
    bubble_1f1b: Bubble
    bubble_interleaved: Bubble | None
    in_flight: dict[str, int]
    batch: BatchPlan
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # TP/CP groups across nodes (spanning.py)

    @property
    def worst(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.peak)

    @property
    def fits(self) -> bool:
        return self.worst.peak <= self.cluster.gpu_memory_bytes

    @property
    def save_host_per_node(self) -> float:
        """CPU memory a node holds while a checkpoint is written (its GPUs' worst rank each)."""
        return max(s.save_host for s in self.stages) * self.cfg.layout.gpus_per_node

    @property
    def save_fits_host(self) -> bool:
        host = self.cluster.host_memory_gb
        return host is None or self.save_host_per_node <= host * 1e9


def attention_of(cluster: ClusterSpec, options: PlanOptions) -> str:
    """The attention kernel planned: the option's, else the cluster file's."""
    return options.attention or cluster.attention


def te_layers_on(cfg: Any, cluster: ClusterSpec) -> bool:
    """Whether the run's ranks on this cluster build Transformer Engine's layers (GPU nodes,
    unless the recipe asks for the local ones): what fuses the norms (`fused_norms`)."""
    return fused_norms(cfg, on_gpu=cluster.device != "cpu")


def _notes(cfg: Any, cluster: ClusterSpec) -> list[str]:
    layout, notes = cfg.layout, []
    if layout.nodes > cluster.nodes:
        notes.append(f"the layout needs {layout.nodes:,} nodes; {cluster.name} has "
                     f"{cluster.nodes:,}")
    return notes


def stage_states(cfg: Any, options: PlanOptions,
                 params: list[ParamCount]) -> list[tuple[ModelState, float]]:
    """Each stage's worst rank's model state, and the CPU memory it holds while a checkpoint
    is written, from the stage's parameters (`stage_params`)."""
    sharding = sharding_of(cfg, options.sharding)
    per = state_bytes_of(cfg, options.fp8_weights)
    offload = offload_share(cfg, options.offload)
    return [(rank_model_state(cfg, count, per, sharding, offload, low),
             save_host_bytes(cfg, count, per, sharding))
            for count, low in zip(params, stage_low_precision_weights(cfg), strict=True)]


def assemble_stages(layers: list[list[int]], params: list[ParamCount],
                    activations: list[StageActivations],
                    states: list[tuple[ModelState, float]]) -> list[StagePlan]:
    """Each stage's plan from its parts, no traffic yet (`with_traffic` adds it): its layers
    per chunk (`stage_layer_counts`), parameters (`stage_params`), activations
    (`stage_activations`) and model state (`stage_states`). The layout search hands in parts
    it holds from layouts differing only in what they do not depend on."""
    return [StagePlan(stage, chunks, count, state, act, [], save)
            for stage, (chunks, count, act, (state, save)) in enumerate(zip(
                layers, params, activations, states, strict=True))]


def stage_memory(cfg: Any, cluster: ClusterSpec, options: PlanOptions) -> list[StagePlan]:
    """Model state and activations of each stage's worst rank, no traffic yet: what a fit
    check needs."""
    params = stage_params(cfg)
    return assemble_stages(stage_layer_counts(cfg), params,
                           stage_activations(cfg, attention_of(cluster, options),
                                             te_layers_on(cfg, cluster)),
                           stage_states(cfg, options, params))


def stage_traffics(cfg: Any, cluster: ClusterSpec, options: PlanOptions,
                   params: list[ParamCount],
                   crossing: dict[str, bool] | None = None) -> list[list[Traffic]]:
    """What each stage's worst rank sends per step, from the stage's parameters
    (`stage_params`); `crossing` (`comm.crossing_kinds` of the layout) may be handed in by a
    caller that planned the same grid before (the layout search: at 16,384 ranks it is the
    slow part)."""
    sharding = sharding_of(cfg, options.sharding)
    crossing = crossing if crossing is not None else crossing_kinds(cfg.layout)
    return [stage_traffic(cfg, cluster, crossing, stage, count, sharding, counts, low)
            for stage, (count, counts, low) in enumerate(zip(
                params, stage_kinds(cfg), stage_low_precision_weights(cfg), strict=True))]


def with_traffic(plans: list[StagePlan], traffics: list[list[Traffic]]) -> list[StagePlan]:
    """`stage_memory`'s plans with their traffic (`stage_traffics`)."""
    return [dataclasses.replace(plan, traffic=traffic)
            for plan, traffic in zip(plans, traffics, strict=True)]


def stage_plans(cfg: Any, cluster: ClusterSpec, options: PlanOptions,
                crossing: dict[str, bool] | None = None) -> list[StagePlan]:
    """Memory and traffic of each stage's worst rank (what a fit check and the step model
    need)."""
    plans = stage_memory(cfg, cluster, options)
    return with_traffic(plans, stage_traffics(cfg, cluster, options,
                                              [plan.params for plan in plans], crossing))


def make_plan(cfg: Any, cluster: ClusterSpec, options: PlanOptions | None = None) -> Plan:
    options = options or PlanOptions()
    layout = cfg.layout
    parameters = model_parameters(cfg)
    m, pp, vpp = layout.microbatches, layout.pipeline, layout.virtual_stages
    stages = stage_plans(cfg, cluster, options)
    return Plan(
        cfg=cfg, cluster=cluster, options=options, sharding=sharding_of(cfg, options.sharding),
        attention=attention_of(cluster, options), parameters=parameters,
        stages=stages,
        groups=group_summaries(layout, options.listed_groups,
                              moe=bool(cfg.model.num_moe_experts)), drawing=drawing(layout),
        bubble_1f1b=bubble(pp, 1, m),
        bubble_interleaved=bubble(pp, vpp, m) if vpp > 1 else None,
        in_flight={"all_forward": in_flight_all_forward(m),
                   "one_f_one_b": in_flight_1f1b(0, pp, m)},
        batch=batch_plan(cfg, gemm_peak_tflops(cfg, cluster), options.mfu,
                         options.token_budget),
        notes=_notes(cfg, cluster),
        warnings=spanning_warnings(cfg, cluster, [s.traffic for s in stages]),
    )

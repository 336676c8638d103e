"""The layout search: every layout the project accepts for a model on a cluster, those the
planner says fit, ranked by a modeled step time (`recipes/plan/steptime.py`).

The model, its sequence length, precision and global batch stay the recipe's; the search
varies TP (inside a node, dividing the heads and KV groups), PP with its VPP choices and the
first/last-stage layer counts Megatron accepts, CP, EP and expert TP (MoE models), the derived
DP, the micro-batch, sequence parallel, recompute (none, selective, full) and the distributed
optimizer (overlapped, as the large recipes run it), alone or under Megatron FSDP's gradient
(ZeRO-2) or gradient-and-weight (ZeRO-3) sharding where it alone does not fit. Memory is the
planner's (`build.stage_plans`), nothing recomputed here.

It prunes without losing a winner: a block (TP, PP split, CP, EP) whose cheapest variant
(SP, ZeRO-3 sharding, micro-batch 1, full recompute) does not fit is skipped whole;
a larger micro-batch is not tried once a smaller one fits nowhere; and more recompute is not
tried once less fits, since it only adds compute. The fastest fitting layouts are then checked
by the project's validation rules in rank order (the listed ones all pass); the planner's
communication grid (which groups cross nodes) is computed once per grid.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import ClusterSpec, gemm_peak_tflops
from recipes.plan.comm import crossing_kinds
from recipes.plan.steptime import HALF_DIM, PEAK_FRACTION, StepTime, step_time

RECOMPUTE = ("none", "selective", "full")
MICRO_BATCHES = (1, 2, 4, 8, 16)
FSDP = ("none", "optim_grads", "optim_grads_params")  # beside the distributed optimizer
LARGEST_CLUSTER_GPUS = 2**20  # how far the smallest-cluster answer looks


@dataclass(frozen=True)
class Candidate:
    """One layout: the overrides that turn the recipe into it."""

    tensor: int
    pipeline: int
    virtual: int | None
    first: int | None  # layers on the first / last stage (None: an even split)
    last: int | None
    context: int
    expert: int
    expert_tensor: int | None
    micro_batch: int
    sequence_parallel: bool
    recompute: str
    distributed: bool
    fsdp: str = "none"  # Megatron FSDP's sharding (with the distributed optimizer)

    def overrides(self) -> list[str]:
        """What to type after the recipe to train this layout."""
        def text(value: Any) -> str:
            return "null" if value is None else str(value).lower()
        return [f"parallel.tensor={self.tensor}", f"parallel.pipeline={self.pipeline}",
                f"parallel.virtual_pipeline={text(self.virtual)}",
                f"parallel.first_stage_layers={text(self.first)}",
                f"parallel.last_stage_layers={text(self.last)}",
                f"parallel.context={self.context}", f"parallel.expert={self.expert}",
                f"parallel.expert_tensor={text(self.expert_tensor)}",
                f"parallel.sequence_parallel={text(self.sequence_parallel)}",
                f"train.micro_batch_size={self.micro_batch}", f"train.recompute={self.recompute}",
                f"optimizer.distributed={text(self.distributed)}",
                f"optimizer.fsdp={self.fsdp}",
                "optimizer.overlap_grad_reduce=true",
                f"optimizer.overlap_param_gather={text(self.distributed)}"]

    def describe(self) -> str:
        parts = [f"TP{self.tensor}" + ("+SP" if self.sequence_parallel else "")]
        if self.pipeline > 1:
            pp = f"PP{self.pipeline}"
            if self.virtual:
                pp += f"xVPP{self.virtual}"
            if self.first is not None:
                pp += f"({self.first}/../{self.last})"
            parts.append(pp)
        if self.context > 1:
            parts.append(f"CP{self.context}")
        if self.expert > 1 or self.expert_tensor is not None:
            et = "" if self.expert_tensor is None else f"/ETP{self.expert_tensor}"
            parts.append(f"EP{self.expert}{et}")
        parts += [f"mbs{self.micro_batch}", f"rc-{self.recompute}",
                  f"fsdp-{self.fsdp}" if self.fsdp != "none" else
                  "distopt" if self.distributed else "ddp"]
        return " ".join(parts)


def apply_candidate(cfg: Any, c: Candidate) -> Any:
    """The recipe's config in layout `c` (sections replaced, the recipe's other fields kept)."""
    parallel = dataclasses.replace(
        cfg.parallel, tensor=c.tensor, pipeline=c.pipeline, virtual_pipeline=c.virtual,
        first_stage_layers=c.first, last_stage_layers=c.last, context=c.context, expert=c.expert,
        expert_tensor=c.expert_tensor, sequence_parallel=c.sequence_parallel,
        batch_p2p_comm=False if c.virtual else cfg.parallel.batch_p2p_comm)
    train = dataclasses.replace(cfg.train, micro_batch_size=c.micro_batch, recompute=c.recompute)
    optimizer = dataclasses.replace(cfg.optimizer, distributed=c.distributed, fsdp=c.fsdp,
                                    overlap_grad_reduce=True,
                                    overlap_param_gather=c.distributed)
    return dataclasses.replace(cfg, parallel=parallel, train=train, optimizer=optimizer)


# --- the axes ---------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_sizes(cfg: Any) -> list[int]:
    """TP inside a node, dividing the heads and the KV groups."""
    m = cfg.model
    groups = m.num_query_groups or m.num_attention_heads
    return [t for t in _divisors(cfg.cluster.gpus_per_node)
            if m.num_attention_heads % t == 0 and groups % t == 0]


def pipeline_splits(layers: int, most: int) -> Iterator[tuple[int, int | None, int | None,
                                                              list[int | None]]]:
    """(PP, first, last, VPP choices): an even split, and first/last stages one or two layers
    lighter than the middle ones (room for the embedding and the loss)."""
    for pp in range(1, min(layers, most) + 1):
        if layers % pp == 0:
            per = layers // pp
            vpps = [None] + ([v for v in _divisors(per) if v > 1] if pp > 1 else [])
            yield pp, None, None, vpps
        if pp < 3:
            continue
        for lighter in (1, 2):
            middle, rest = divmod(layers + 2 * lighter, pp)
            end = middle - lighter
            if rest or end < 1:
                continue
            yield pp, end, end, [None] + [v for v in _divisors(math.gcd(end, middle)) if v > 1]


def context_sizes(cfg: Any, most: int) -> list[int]:
    seq = cfg.model.seq_length
    return [c for c in _divisors(most) if seq % (2 * c) == 0 or c == 1]


def expert_choices(cfg: Any, tp: int, room: int) -> list[tuple[int, int | None]]:
    """(EP, expert TP) for MoE models; dense ones have none."""
    experts = cfg.model.num_moe_experts
    if not experts:
        return [(1, None)]
    found = []
    for ep in _divisors(experts):
        for etp in sorted({1, tp}):
            if ep * etp <= room * tp and room * tp % (ep * etp) == 0:
                found.append((ep, None if etp == tp else etp))
    return found


# --- one evaluated layout ---------------------------------------------------------------------

@dataclass
class Evaluated:
    candidate: Candidate
    peak: float
    fits: bool
    time: StepTime | None
    invalid: str | None = None  # the validation rule's line, when it refuses it

    @property
    def seconds(self) -> float:
        return self.time.total if self.time else math.inf


@dataclass
class SearchResult:
    world: int
    gpus_per_node: int
    enumerated: int = 0
    pruned_blocks: int = 0
    dominated: int = 0  # SP-off and DDP twins of planned layouts (never faster, never smaller)
    fitting: list[Evaluated] = field(default_factory=list)
    too_big: list[Evaluated] = field(default_factory=list)
    listed: list[Evaluated] = field(default_factory=list)
    invalid: list[Evaluated] = field(default_factory=list)
    seconds: float = 0.0


class _Searcher:
    def __init__(self, cfg: Any, cluster: ClusterSpec, options: PlanOptions) -> None:
        self.cfg, self.cluster, self.options = cfg, cluster, options
        self.crossing: dict[tuple, dict[str, bool]] = {}
        self.peak = gemm_peak_tflops(cfg, cluster)
        self.fraction = cluster.gemm_peak_fraction or PEAK_FRACTION
        self.half = cluster.gemm_half_dim or HALF_DIM
        self.latency = (cluster.collective_latency_us or 0.0) * 1e-6
        self.kernel = (cluster.kernel_overhead_us or 0.0) * 1e-6
        self.host_cores = cluster.host_cores

    def _crossing(self, cfg: Any) -> dict[str, bool]:
        layout = cfg.layout
        key = (layout.tensor, layout.context, layout.pipeline, layout.expert,
               layout.expert_tensor_size, layout.gpus_per_node)
        if key not in self.crossing:
            self.crossing[key] = crossing_kinds(layout)
        return self.crossing[key]

    def evaluate(self, c: Candidate, timed: bool = True) -> Evaluated:
        cfg = apply_candidate(self.cfg, c)
        stages = stage_plans(cfg, self.cluster, self.options, self._crossing(cfg))
        peak = max(s.peak for s in stages)
        fits = peak <= self.cluster.gpu_memory_bytes
        time = step_time(cfg, stages, self.peak, peak_fraction=self.fraction,
                         half_dim=self.half, latency_s=self.latency,
                         kernel_s=self.kernel, host_cores=self.host_cores) if timed else None
        return Evaluated(c, peak, fits, time)


def _blocks(cfg: Any, world: int) -> Iterator[tuple[int, int, int | None, int | None,
                                                    list[int | None], int, int, int | None]]:
    m = cfg.model
    for tp in tensor_sizes(cfg):
        for pp, first, last, vpps in pipeline_splits(m.num_layers, world // tp):
            if world % (tp * pp):
                continue
            for cp in context_sizes(cfg, world // (tp * pp)):
                dp = world // (tp * pp * cp)
                if cfg.train.global_batch_size % dp:
                    continue
                for ep, etp in expert_choices(cfg, tp, dp * cp):
                    yield tp, pp, first, last, vpps, cp, ep, etp


def search(cfg: Any, cluster: ClusterSpec, options: PlanOptions | None = None,
           top: int = 10) -> SearchResult:
    """Every accepted layout of `cfg`'s model at its world size on `cluster`'s nodes, ranked."""
    import time

    from recipes.config.validation import validate

    start = time.perf_counter()
    options = options or PlanOptions(listed_groups=0)
    searcher = _Searcher(cfg, cluster, options)
    layout = cfg.layout
    result = SearchResult(layout.world_size, layout.gpus_per_node)
    moe = bool(cfg.model.num_moe_experts)
    for tp, pp, first, last, vpps, cp, ep, etp in _blocks(cfg, layout.world_size):
        dp = layout.world_size // (tp * pp * cp)
        cheapest = Candidate(tp, pp, None, first, last, cp, ep, etp, 1, tp > 1, "full", True,
                             FSDP[-1])
        result.enumerated += 1
        if not searcher.evaluate(cheapest, timed=False).fits:
            result.pruned_blocks += 1
            continue
        # Sequence parallel off and plain DDP are counted, not planned: each has the same
        # compute and no less communication than SP on / the distributed optimizer (the DP
        # reduce-scatter and all-gather send 3/4 of an all-reduce's bytes and both overlap)
        # and needs more memory, so it never ranks above its twin.
        twins = (2 if tp > 1 and not moe else 1) * 2
        for vpp in vpps:
            planned = _micro_batches(searcher, result, cfg, dp,
                                     (tp, pp, vpp, first, last, cp, ep, etp), tp > 1, True)
            result.dominated += planned * (twins - 1)
    result.fitting.sort(key=lambda e: (e.seconds, e.peak))
    result.too_big.sort(key=lambda e: (e.seconds, e.peak))
    for evaluated in result.fitting:
        if len(result.listed) >= top:
            break
        try:
            validate(apply_candidate(cfg, evaluated.candidate))
        except ConfigError as error:
            evaluated.invalid = str(error)
            result.invalid.append(evaluated)
            continue
        result.listed.append(evaluated)
    result.seconds = time.perf_counter() - start
    return result


def candidate_of(cfg: Any) -> Candidate:
    """The layout a config already has (a recipe's, or a published one written as one)."""
    p, t = cfg.parallel, cfg.train
    return Candidate(p.tensor, p.pipeline, p.virtual_pipeline, p.first_stage_layers,
                     p.last_stage_layers, p.context, p.expert, p.expert_tensor,
                     t.micro_batch_size, p.sequence_parallel, t.recompute,
                     cfg.optimizer.distributed, cfg.optimizer.fsdp)


def spread(cfg: Any, result: SearchResult, k: int) -> list[tuple[int, Evaluated]]:
    """`k` fitting layouts spread evenly over the search's ranking, fastest and slowest
    included, each with its rank (from 1) among those that fit. The top K of a small model can
    lie closer together than one machine's step times vary from run to run; layouts across the
    whole range test whether the step model orders what it predicts. Each passes validation:
    one a rule refuses gives way to the nearest one not already picked (the faster of two)."""
    from recipes.config.validation import validate

    fitting = result.fitting

    def valid(i: int) -> bool:
        try:
            validate(apply_candidate(cfg, fitting[i].candidate))
        except ConfigError:
            return False
        return True

    n, picked = len(fitting), []
    for slot in range(min(k, n)):
        target = round(slot * (n - 1) / max(min(k, n) - 1, 1))
        for i in sorted(range(n), key=lambda i: (abs(i - target), i > target)):
            if i not in picked and valid(i):
                picked.append(i)
                break
    return [(i + 1, fitting[i]) for i in sorted(picked)]


def place(cfg: Any, cluster: ClusterSpec, result: SearchResult,
          candidate: Candidate) -> tuple[int | None, Evaluated]:
    """Where `candidate` ranks among the search's fitting layouts (None: it does not fit)."""
    evaluated = _Searcher(cfg, cluster, PlanOptions(listed_groups=0)).evaluate(candidate)
    if not evaluated.fits:
        return None, evaluated
    return 1 + sum(1 for e in result.fitting if e.seconds < evaluated.seconds), evaluated


def _micro_batches(searcher: _Searcher, result: SearchResult, cfg: Any, dp: int,
                   grid: tuple, sp: bool, distributed: bool) -> int:
    """Plan the micro-batches and recompute choices of one grid; returns how many it planned."""
    tp, pp, vpp, first, last, cp, ep, etp = grid
    per_replica = cfg.train.global_batch_size // dp
    planned = 0
    for mbs in MICRO_BATCHES:
        if per_replica % mbs:
            break
        if vpp and (per_replica // mbs) % pp:
            continue
        fitted = False
        for recompute in RECOMPUTE:
            sharding = _first_fitting_sharding(searcher, result, (
                tp, pp, vpp, first, last, cp, ep, etp, mbs, sp, recompute, distributed))
            planned += sharding[1]
            fitted = fitted or sharding[0] is not None
            if sharding[0] == "none":
                break  # more recompute only adds compute
        if not fitted:
            break
    return planned


def _first_fitting_sharding(searcher: _Searcher, result: SearchResult,
                            fields: tuple) -> tuple[str | None, int]:
    """The least sharding (the distributed optimizer, then Megatron FSDP's ZeRO-2 and ZeRO-3)
    that fits this layout, kept; more sharding only adds communication. (None when none fits,
    and how many were planned.)"""
    for planned, fsdp in enumerate(FSDP, start=1):
        result.enumerated += 1
        evaluated = searcher.evaluate(Candidate(*fields, fsdp))
        if evaluated.fits:
            result.fitting.append(evaluated)
            return fsdp, planned
        result.too_big.append(evaluated)
    return None, len(FSDP)


def smallest_fitting_world(cfg: Any, cluster: ClusterSpec) -> tuple[int, Candidate] | None:
    """The fewest nodes of this cluster's kind on which some layout fits (the global batch
    grown with DP where it must be), or None within `LARGEST_CLUSTER_GPUS`."""
    gpn = cfg.cluster.gpus_per_node
    nodes = max(1, cfg.cluster.nodes)
    while nodes * gpn <= LARGEST_CLUSTER_GPUS:
        nodes *= 2
        world = nodes * gpn
        batch = max(cfg.train.global_batch_size, world)
        bigger = dataclasses.replace(
            cfg, cluster=dataclasses.replace(cfg.cluster, nodes=nodes),
            train=dataclasses.replace(cfg.train, global_batch_size=batch))
        searcher = _Searcher(bigger, cluster, PlanOptions(listed_groups=0))
        for tp, pp, first, last, _vpps, cp, ep, etp in _blocks(bigger, world):
            cheapest = Candidate(tp, pp, None, first, last, cp, ep, etp, 1, tp > 1, "full", True,
                                 FSDP[-1])
            if searcher.evaluate(cheapest, timed=False).fits:
                return nodes, cheapest
    return None

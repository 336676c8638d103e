"""The layout search: every layout the project accepts for a model on a cluster, those the
planner says fit, ranked by a modeled step time (`recipes/plan/steptime.py`).

The model, its sequence length, precision and global batch stay the recipe's; the search
varies TP (inside a node, dividing the heads and KV groups), PP with its VPP choices and the
first/last-stage layer counts Megatron accepts, CP, EP and expert TP (MoE models), the derived
DP, the micro-batch, sequence parallel, recompute (none, selective, full) and the distributed
optimizer (overlapped, as the large recipes run it), alone or under Megatron FSDP's gradient
(ZeRO-2) or gradient-and-weight (ZeRO-3) sharding where it alone does not fit (PP 1: Megatron
FSDP's mesh holds no pipeline), and with its state offloaded to CPU memory where none of those
fits (bf16/fp16 weights); an offloaded layout ranks after every layout that fits without it,
since the step model does not price the CPU's optimizer step. Memory is the planner's
(`build.stage_memory`), nothing recomputed here.

It prunes without losing a winner: a block (TP, PP split, CP, EP) whose cheapest variant
(SP, ZeRO-3 sharding, micro-batch 1, full recompute) does not fit is skipped whole;
a larger micro-batch is not tried once a smaller one fits nowhere; and more recompute is not
tried once less fits, since it only adds compute. The fastest fitting layouts are then checked
by the project's validation rules in rank order (the listed ones all pass); the planner's
communication grid (which groups cross nodes) is computed once per grid.

It prunes without changing the answer: memory is planned before traffic and step time, which
only the layouts that fit or lose on memory by under `NEAR_MISS` (the report shows those) get;
the most sharded variant of a layout is sized first, and when it is too big by over
`NEAR_MISS`, so are the less sharded ones (same activations, more state), counted unplanned;
and each stage's parameters, activations, model state and traffic, and a layer's products,
are memoised on the few candidate fields they depend on (`*_DEPEND(S)_ON`), each
candidate's layout worked out once. `search(..., exhaustive=True)` plans every layout in full
and memoises nothing: the reference `scripts/bench_search.py` times the search against, and
`tests/unit/test_search_fast.py` holds it to, figure for figure (docs/search.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, cached_property
from operator import attrgetter
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import as_written
from recipes.config.fast_paths import router_graph_keeps_norm
from recipes.config.layout import Layout
from recipes.config.schema import RunConfig
from recipes.models import kinds
from recipes.models.hybrid.pattern import has_pipes, layer_symbols, segments
from recipes.plan.activations import stage_activations
from recipes.plan.build import (
    PlanOptions,
    StagePlan,
    assemble_stages,
    attention_of,
    stage_memory,
    stage_states,
    stage_traffics,
    te_layers_on,
    with_traffic,
)
from recipes.plan.cluster import ClusterSpec, gemm_peak_tflops
from recipes.plan.comm import crossing_kinds, traffic_sharding
from recipes.plan.memory import sharding_of
from recipes.plan.params import stage_layer_counts, stage_params
from recipes.plan.steptime import (
    HALF_DIM,
    PEAK_FRACTION,
    KindSeconds,
    StepTime,
    kind_forward_seconds,
    step_time,
)

RECOMPUTE = ("none", "selective", "full")


def recompute_choices(cfg: Any, te_layers: bool) -> tuple[str, ...]:
    """The recompute the search tries, by memory saved: none; selective as Megatron's default
    (the attention core), then with the norms, then with a dense MLP's or the MoE layer's
    activation or the whole MoE layer (`selective:<modules>`, `train.recompute_modules`); full.
    Left out: what the run's CUDA graphs or EP overlap refuse (recipes/config/fast_paths.py),
    a dense MLP with biases (`check_mlp_recompute_without_linear_biases`), and the norms where
    none is a module of its own (`te_layers` of a model without MoE layers: Transformer Engine
    fuses them, `activations.fused_norms`) or the router's graph keeps the MoE layer's."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    symbols = set(kinds.gpt_layer_kinds(m)) if not m.is_hybrid else set(
        layer_symbols(m.hybrid_layer_pattern))
    norms = not te_layers or (kinds.MOE in symbols and not router_graph_keeps_norm(cfg))
    base = "selective:core_attn,layernorm" if norms else "selective:core_attn"
    choices = ["none", "selective", *([base] if norms else [])]
    if kinds.MLP in symbols and not m.add_bias_linear:
        choices.append(base + ",mlp")
    if kinds.MOE in symbols:
        if m.moe_grouped_gemm:
            choices.append(base + ",moe_act")
        if not p.ep_comm_overlap and "moe_router" not in t.cuda_graph_modules:
            choices.append(base + ",moe")
    if t.cuda_graphs == "none" and not p.ep_comm_overlap:
        choices.append("full")
    return tuple(choices)


def recompute_choice(train: Any) -> str:
    """A run's recompute as a `recompute_choices` entry (selective with Megatron's default list
    is plain `selective`)."""
    if train.recompute != "selective" or train.recompute_modules == ["core_attn"]:
        return train.recompute
    return f"selective:{','.join(train.recompute_modules)}"


def _recompute_overrides(choice: str) -> list[str]:
    fields = recompute_fields(choice)
    return [f"train.recompute={fields['recompute']}",
            f"train.recompute_modules=[{','.join(fields['recompute_modules'])}]"]


def recompute_fields(choice: str) -> dict[str, Any]:
    """`train.recompute` and `train.recompute_modules` of one `recompute_choices` entry."""
    mode, _, modules = choice.partition(":")
    return {"recompute": mode,
            "recompute_modules": modules.split(",") if modules else ["core_attn"]}
MICRO_BATCHES = (1, 2, 4, 8, 16)
FSDP = ("none", "optim_grads", "optim_grads_params")  # beside the distributed optimizer
LARGEST_CLUSTER_GPUS = 2**20  # how far the smallest-cluster answer looks
NEAR_MISS = 1.25  # a layout that lost on memory is shown if its peak is within 25 % of it
# The candidate's fields each memoised figure depends on (the rest of the config is the
# recipe's, the same for every candidate): each stage's parameters on the model chunks it
# holds; its activations on the chunks' layers and their widths (not EP), the tokens, the
# micro-batches in flight, sequence parallel and recompute; its model state on its parameters
# and the optimizer's sharding over DP x CP; its traffic on all but offload and the sharding,
# of which only how often DP reduces and gathers (`TRAFFIC_DEPENDS_ON` and
# `comm.traffic_sharding`: Megatron FSDP's levels, `comm.dp_passes`); one layer's products on the
# widths and tokens. tests/unit/test_search_fast.py varies every other field of each and
# checks that the figure does not move.
PARAMS_DEPEND_ON = ("tensor", "pipeline", "virtual", "first", "last", "expert", "expert_tensor")
ACTIVATIONS_DEPEND_ON = ("tensor", "pipeline", "virtual", "first", "last", "expert_tensor",
                         "context", "micro_batch", "sequence_parallel", "recompute")
STATES_DEPEND_ON = PARAMS_DEPEND_ON + ("context", "distributed", "fsdp", "offload")
TRAFFIC_DEPENDS_ON = PARAMS_DEPEND_ON + ("context", "micro_batch", "sequence_parallel",
                                         "recompute")
FORWARD_DEPENDS_ON = ("tensor", "context", "micro_batch", "expert", "expert_tensor")


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
    offload: bool = False  # the distributed optimizer's state in CPU memory

    def overrides(self) -> list[str]:
        """What to type after the recipe to train this layout."""
        return [f"parallel.tensor={self.tensor}", f"parallel.pipeline={self.pipeline}",
                f"parallel.virtual_pipeline={as_written(self.virtual)}",
                f"parallel.first_stage_layers={as_written(self.first)}",
                f"parallel.last_stage_layers={as_written(self.last)}",
                f"parallel.context={self.context}", f"parallel.expert={self.expert}",
                f"parallel.expert_tensor={as_written(self.expert_tensor)}",
                f"parallel.sequence_parallel={as_written(self.sequence_parallel)}",
                f"train.micro_batch_size={self.micro_batch}",
                *_recompute_overrides(self.recompute),
                f"optimizer.distributed={as_written(self.distributed)}",
                f"optimizer.fsdp={self.fsdp}",
                f"optimizer.cpu_offload={as_written(self.offload)}",
                "optimizer.overlap_grad_reduce=true",
                f"optimizer.overlap_param_gather={as_written(self.distributed)}",
                # interleaving cannot batch its sends, and TP overlap needs sequence parallel
                # (`apply_candidate`)
                *(["parallel.batch_p2p_comm=false"] if self.virtual else []),
                *([] if self.sequence_parallel else ["parallel.tp_comm_overlap=false"])]

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
                  "distopt+offload" if self.offload else
                  "distopt" if self.distributed else "ddp"]
        return " ".join(parts)


def apply_candidate(cfg: Any, c: Candidate) -> Any:
    """The recipe's config in layout `c` (sections replaced, the recipe's other fields kept)."""
    parallel = dataclasses.replace(
        cfg.parallel, tensor=c.tensor, pipeline=c.pipeline, virtual_pipeline=c.virtual,
        first_stage_layers=c.first, last_stage_layers=c.last, context=c.context, expert=c.expert,
        expert_tensor=c.expert_tensor, sequence_parallel=c.sequence_parallel,
        batch_p2p_comm=False if c.virtual else cfg.parallel.batch_p2p_comm,
        tp_comm_overlap=cfg.parallel.tp_comm_overlap and c.sequence_parallel)
    train = dataclasses.replace(cfg.train, micro_batch_size=c.micro_batch,
                                **recompute_fields(c.recompute))
    optimizer = dataclasses.replace(cfg.optimizer, distributed=c.distributed, fsdp=c.fsdp,
                                    cpu_offload=c.offload, overlap_grad_reduce=True,
                                    overlap_param_gather=c.distributed)
    return dataclasses.replace(cfg, parallel=parallel, train=train, optimizer=optimizer)


# --- the axes ---------------------------------------------------------------------------------

def shardings(cfg: Any, pipeline: int) -> list[tuple[str, bool]]:
    """(Megatron FSDP level, offload) of a layout, least sharded first: the distributed
    optimizer, Megatron FSDP's ZeRO-2 and ZeRO-3 (PP 1 only: its device mesh holds no
    pipeline, `recipes/config/sharding_rules.py`), then the distributed optimizer's state in
    CPU memory (bf16/fp16 weights only, as Megatron's hybrid-device optimizer takes them)."""
    found = [(fsdp, False) for fsdp in (FSDP if pipeline == 1 else FSDP[:1])]
    if cfg.precision.dtype != "fp32":
        found.append(("none", True))
    return found


def _smallest(cfg: Any, pipeline: int) -> list[tuple[str, bool]]:
    """The variants with the least model state per rank: the most sharded GPU-resident one and
    offload (which is smaller depends on DP)."""
    variants = shardings(cfg, pipeline)
    gpu = [v for v in variants if not v[1]]
    return [gpu[-1], *[v for v in variants if v[1]]]


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


def model_pipeline_splits(cfg: Any, most: int) -> Iterator[tuple[int, int | None, int | None,
                                                                  list[int | None]]]:
    """`pipeline_splits` as the model allows them: a hybrid pattern cut by `|` fixes PP x VPP to
    its segment count (no uneven ends beside it); one without `|` takes no virtual stages
    (`recipes/models/hybrid/rules.py`)."""
    pattern = cfg.model.hybrid_layer_pattern
    if has_pipes(pattern):
        chunks = len(segments(pattern))
        for pp in _divisors(min(chunks, most)):
            if chunks % pp == 0 and (pp > 1 or chunks == 1):  # virtual stages need PP > 1
                yield pp, None, None, [None if chunks == pp else chunks // pp]
        return
    for pp, first, last, vpps in pipeline_splits(cfg.model.num_layers, most):
        yield pp, first, last, [None] if pattern is not None else vpps


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

    def ranking(self) -> tuple[bool, float, float]:
        """Where a fitting layout ranks: an offloaded one after every one that fits without it
        (its CPU step is not modeled), then by modeled step, then by memory."""
        return self.candidate.offload, self.seconds, self.peak


@dataclass
class SearchResult:
    world: int
    gpus_per_node: int
    enumerated: int = 0  # layouts considered
    skipped: int = 0  # of those, not planned: less sharded than one too big by over NEAR_MISS
    timed: int = 0  # of those planned (for memory), planned in full: traffic and step time
    pruned_blocks: int = 0
    dominated: int = 0  # SP-off and DDP twins of planned layouts, counted (see `search`)
    fitting: list[Evaluated] = field(default_factory=list)
    too_big: list[Evaluated] = field(default_factory=list)  # timed ones (see `search`)
    listed: list[Evaluated] = field(default_factory=list)
    invalid: list[Evaluated] = field(default_factory=list)  # refused, ranked before a listed one
    refused: int = 0  # fit, but a validation rule refuses them (not in `fitting`)
    seconds: float = 0.0


class _Fixed(RunConfig):
    """A config the search builds and never changes: its layout is worked out once, not on
    each of the planner's hundred reads of it (`RunConfig.layout` builds it anew on every
    read, since a config may change between two). `dataclasses.replace` of one is another,
    with its own layout."""

    @cached_property
    def layout(self) -> Layout:  # type: ignore[override]
        return Layout.from_config(self)


@dataclass(frozen=True)
class Sized:
    """A candidate planned for memory: its stages (no traffic yet), peak, and config when it
    was built."""

    candidate: Candidate
    stages: list[StagePlan]
    peak: float
    cfg: Any = None


def _memo(cache: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
    """`compute()` once per `key`."""
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def _fields(c: Candidate, names: tuple[str, ...]) -> tuple:
    return attrgetter(*names)(c)


def own_sharding(options: PlanOptions) -> PlanOptions:
    """`options` without the planner's `sharding=` and `offload=true`: each candidate names its
    own sharding and offload (`Candidate.fsdp`, `.offload`), which its label and command say,
    so they and not a what-if of one layout are what it is priced at (`scripts/plan.py` refuses
    the what-ifs with search=true: `recipes.plan.command.search_without_what_ifs`)."""
    return dataclasses.replace(options, sharding=None, offload=False)


class _Searcher:
    """Plans candidates of one recipe on one cluster. `fast`: each candidate's layout is
    worked out once, and its stages' parameters, activations, model state and traffic and
    its layer's products are memoised on the candidate fields they depend on (the
    `*_DEPEND(S)_ON` tuples); else every figure is planned anew (the reference the fast search
    is checked against)."""

    def __init__(self, cfg: Any, cluster: ClusterSpec, options: PlanOptions,
                 fast: bool = True) -> None:
        self.cluster, self.options, self.fast = cluster, own_sharding(options), fast
        self.cfg = _Fixed(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
                          ) if fast else cfg
        self.crossing: dict[tuple, dict[str, bool]] = {}
        self.memo: dict[str, dict[Any, Any]] = {
            name: {} for name in ("params", "activations", "states", "traffic", "forward")}
        peak = gemm_peak_tflops(cfg, cluster)
        if peak is None:
            raise ConfigError(f"the search times layouts at the GPUs' peak, and {cluster.name} "
                              f"has none for this run's {cfg.plugins.gemm_precision()} GEMMs; "
                              "give cluster=FILE of GPUs that run them (with peak_tflops for "
                              "that precision)")
        self.peak = peak
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

    def size(self, c: Candidate) -> Sized:
        """`c` planned for memory: each stage's worst rank's state and activations. Fast, the
        candidate's config is built only when a part is not held yet."""
        if not self.fast:
            cfg = apply_candidate(self.cfg, c)
            stages = stage_memory(cfg, self.cluster, self.options)
            return Sized(c, stages, max(s.peak for s in stages), cfg)
        config = cache(lambda: apply_candidate(self.cfg, c))
        memo = self.memo
        layers, params = _memo(memo["params"], _fields(c, PARAMS_DEPEND_ON), lambda: (
            stage_layer_counts(config()), stage_params(config())))
        activations = _memo(memo["activations"], _fields(c, ACTIVATIONS_DEPEND_ON), lambda: (
            stage_activations(config(), attention_of(self.cluster, self.options),
                              te_layers_on(self.cfg, self.cluster))))
        states = _memo(memo["states"], _fields(c, STATES_DEPEND_ON),
                       lambda: stage_states(config(), self.options, params))
        stages = assemble_stages(layers, params, activations, states)
        return Sized(c, stages, max(s.peak for s in stages))

    def timed(self, sized: Sized) -> Evaluated:
        """A sized candidate planned in full: its traffic, then its modeled step time."""
        c = sized.candidate
        cfg = sized.cfg or apply_candidate(self.cfg, c)

        def traffic() -> list:
            return stage_traffics(cfg, self.cluster, self.options,
                                  [s.params for s in sized.stages], self._crossing(cfg))

        def forward() -> dict[str, KindSeconds]:
            return kind_forward_seconds(cfg, self.peak * 1e12, self.fraction, self.half)

        if self.fast:
            sharding = traffic_sharding(sharding_of(cfg, self.options.sharding))
            traffics = _memo(self.memo["traffic"],
                             (_fields(c, TRAFFIC_DEPENDS_ON), sharding), traffic)
            layer = _memo(self.memo["forward"], _fields(c, FORWARD_DEPENDS_ON), forward)
        else:
            traffics, layer = traffic(), None
        time = step_time(cfg, with_traffic(sized.stages, traffics), self.peak,
                         peak_fraction=self.fraction, half_dim=self.half,
                         latency_s=self.latency, kernel_s=self.kernel,
                         host_cores=self.host_cores, forward=layer)
        return Evaluated(c, sized.peak, self.fits(sized), time)

    def fits(self, sized: Sized) -> bool:
        """On the GPU, and an offloaded state in the node's CPU memory (when the cluster file
        gives it): each of the node's ranks holds its stage's share there."""
        host = self.cluster.host_memory_gb
        offloaded = max(s.state.offloaded for s in sized.stages)
        in_host = host is None or offloaded * self.cfg.cluster.gpus_per_node <= host * 1e9
        return sized.peak <= self.cluster.gpu_memory_bytes and in_host

    def evaluate(self, c: Candidate, timed: bool = True) -> Evaluated:
        """`c` planned: its worst rank's memory and (`timed`) its step time."""
        sized = self.size(c)
        return self.timed(sized) if timed else Evaluated(c, sized.peak, self.fits(sized), None)


def _blocks(cfg: Any, world: int) -> Iterator[tuple[int, int, int | None, int | None,
                                                    list[int | None], int, int, int | None]]:
    for tp in tensor_sizes(cfg):
        for pp, first, last, vpps in model_pipeline_splits(cfg, world // tp):
            if world % (tp * pp):
                continue
            for cp in context_sizes(cfg, world // (tp * pp)):
                dp = world // (tp * pp * cp)
                if cfg.train.global_batch_size % dp:
                    continue
                for ep, etp in expert_choices(cfg, tp, dp * cp):
                    yield tp, pp, first, last, vpps, cp, ep, etp


def search(cfg: Any, cluster: ClusterSpec, options: PlanOptions | None = None,
           top: int = 10, exhaustive: bool = False) -> SearchResult:
    """Every accepted layout of `cfg`'s model at its world size on `cluster`'s nodes, ranked.

    Every layout that fits is timed (its rank among them is the answer's), and so is every one
    too big by up to `NEAR_MISS` of the GPU's memory (what the report shows of those that lost
    on memory); one too big by more is planned for its memory only, unless no layout is that
    close. `exhaustive`: every layout planned in full and nothing memoised but the node-crossing
    grid, the reference the fast search must agree with exactly (`scripts/bench_search.py`)."""
    import time

    start = time.perf_counter()
    options = options or PlanOptions(listed_groups=0)
    searcher = _Searcher(cfg, cluster, options, fast=not exhaustive)
    layout = cfg.layout
    result = SearchResult(layout.world_size, layout.gpus_per_node)
    planner = _Planner(searcher, result, None if exhaustive else
                       NEAR_MISS * cluster.gpu_memory_bytes)
    moe = bool(cfg.model.num_moe_experts)
    for tp, pp, first, last, vpps, cp, ep, etp in _blocks(cfg, layout.world_size):
        dp = layout.world_size // (tp * pp * cp)
        cheapest = [Candidate(tp, pp, None, first, last, cp, ep, etp, 1, tp > 1, "full", True,
                              fsdp, offload) for fsdp, offload in _smallest(cfg, pp)]
        result.enumerated += 1
        if not any(searcher.evaluate(c, timed=False).fits for c in cheapest):
            result.pruned_blocks += 1
            continue
        # Counted, not planned: plain DDP, one for each micro-batch and recompute choice
        # planned (the same compute and no less communication than the distributed optimizer,
        # whose reduce-scatter and all-gather send 3/4 of an all-reduce's bytes and overlap,
        # and more memory); with TP on a dense model, sequence parallel off, each variant
        # planned and its DDP twin (more memory, and every TP rank repeats the norms, residual
        # adds and dropouts on all tokens, work the step model does not price, while its
        # exposed TP saving, the row-parallel backward's gather, is of that size).
        sp_off = tp > 1 and not moe
        for vpp in vpps:
            planned, pairs = _micro_batches(
                planner, cfg, dp, (tp, pp, vpp, first, last, cp, ep, etp), tp > 1, True)
            result.dominated += (planned if sp_off else 0) + pairs * (2 if sp_off else 1)
    if planner.far and not result.too_big:
        # nothing lost on memory by a little: the report shows the fastest of all of them
        result.too_big = [searcher.evaluate(c) for c in planner.far]
        result.timed, result.skipped = result.timed + len(planner.far), 0
    result.fitting.sort(key=Evaluated.ranking)
    result.too_big.sort(key=lambda e: (e.seconds, e.peak))
    _set_aside_refused(cfg, result, top)
    result.seconds = time.perf_counter() - start
    return result


def refusal(cfg: Any, c: Candidate) -> str | None:
    """The line of the first validation rule that refuses `cfg` in layout `c`, or None."""
    from recipes.config.validation import validate

    try:
        validate(apply_candidate(cfg, c))
    except ConfigError as error:
        return str(error)
    return None


def _set_aside_refused(cfg: Any, result: SearchResult, top: int) -> None:
    """Layouts that fit but that a validation rule refuses (one the axes cannot see, such as a
    plugin's, or a phase's own sizes) leave the ranking, so that a rank, a count of those that
    fit, `confirm=` and the recipe's own place count only what can be trained; those ahead of
    the last listed one are kept to show with their rule's line."""
    trainable = []
    for evaluated in result.fitting:
        evaluated.invalid = refusal(cfg, evaluated.candidate)
        if evaluated.invalid is None:
            trainable.append(evaluated)
            continue
        result.refused += 1
        if len(trainable) < top:
            result.invalid.append(evaluated)
    result.fitting, result.listed = trainable, trainable[:top]


def candidate_of(cfg: Any) -> Candidate:
    """The layout a config already has (a recipe's, or a published one written as one)."""
    p, t = cfg.parallel, cfg.train
    return Candidate(p.tensor, p.pipeline, p.virtual_pipeline, p.first_stage_layers,
                     p.last_stage_layers, p.context, p.expert, p.expert_tensor,
                     t.micro_batch_size, p.sequence_parallel, recompute_choice(t),
                     cfg.optimizer.distributed, cfg.optimizer.fsdp, cfg.optimizer.cpu_offload)


def spread(result: SearchResult, k: int) -> list[tuple[int, Evaluated]]:
    """`k` fitting layouts spread evenly over the search's ranking, fastest and slowest
    included, each with its rank (from 1) among those that fit. The top K of a small model can
    lie closer together than one machine's step times vary from run to run; layouts across the
    whole range test whether the step model orders what it predicts. Each passes validation
    (`_set_aside_refused`)."""
    n = len(result.fitting)
    picked = sorted({round(slot * (n - 1) / max(min(k, n) - 1, 1)) for slot in range(min(k, n))})
    return [(i + 1, result.fitting[i]) for i in picked]


def place(cfg: Any, cluster: ClusterSpec, result: SearchResult,
          candidate: Candidate) -> tuple[int | None, Evaluated]:
    """Where `candidate` ranks among the search's fitting layouts (None: it does not fit)."""
    evaluated = _Searcher(cfg, cluster, PlanOptions(listed_groups=0)).evaluate(candidate)
    if not evaluated.fits:
        return None, evaluated
    return 1 + sum(1 for e in result.fitting if e.ranking() < evaluated.ranking()), evaluated


@dataclass
class _Planner:
    """Where one search's candidates go: planned by `searcher`, kept in `result` (timed), or,
    too big by more than `near` bytes, in `far` (memory only; `near` None: every one timed)."""

    searcher: _Searcher
    result: SearchResult
    near: float | None
    far: list[Candidate] = field(default_factory=list)
    sized: dict[Candidate, Sized] = field(default_factory=dict)  # planned ahead of its turn

    def plan(self, c: Candidate) -> bool:
        """Plan `c` and keep it; whether it fits."""
        self.result.enumerated += 1
        sized = self.sized.pop(c, None) or self.searcher.size(c)
        if self.near is not None and sized.peak > self.near:
            self.far.append(c)
            return False
        self.result.timed += 1
        evaluated = self.searcher.timed(sized)
        (self.result.fitting if evaluated.fits else self.result.too_big).append(evaluated)
        return evaluated.fits

    def far_beyond(self, fields: tuple) -> bool:
        """Whether the most sharded variant of a layout (`fields`, all but the sharding) is
        too big by more than `near`: then so is every less sharded one (the same activations,
        more state per rank), and they are counted, not planned. Else it is kept for its
        turn."""
        if self.near is None:
            return False
        cfg, pipeline = self.searcher.cfg, fields[1]
        variants = [Candidate(*fields, *v) for v in shardings(cfg, pipeline)]
        smallest = [Candidate(*fields, *v) for v in _smallest(cfg, pipeline)]
        sized = {c: self.searcher.size(c) for c in smallest}
        if any(one.peak <= self.near for one in sized.values()):
            self.sized.update(sized)
            return False
        self.result.enumerated += len(variants)
        self.result.skipped += len(variants) - len(smallest)
        self.far += variants
        return True


def _micro_batches(planner: _Planner, cfg: Any, dp: int, grid: tuple, sp: bool,
                   distributed: bool) -> tuple[int, int]:
    """Plan the micro-batches and recompute choices of one grid; returns how many layouts it
    planned (each sharding variant) and how many (micro-batch, recompute) pairs."""
    tp, pp, vpp, first, last, cp, ep, etp = grid
    per_replica = cfg.train.global_batch_size // dp
    planned = pairs = 0
    for mbs in MICRO_BATCHES:
        if per_replica % mbs:
            break
        if vpp and (per_replica // mbs) % pp:
            continue
        fitted = False
        for recompute in recompute_choices(cfg, te_layers_on(cfg, planner.searcher.cluster)):
            sharding = _first_fitting_sharding(planner, (
                tp, pp, vpp, first, last, cp, ep, etp, mbs, sp, recompute, distributed))
            planned, pairs = planned + sharding[1], pairs + 1
            fitted = fitted or sharding[0] is not None
            if sharding[0] == "none":
                break  # more recompute only adds compute
        if not fitted:
            break
    return planned, pairs


def _first_fitting_sharding(planner: _Planner, fields: tuple) -> tuple[str | None, int]:
    """The least sharding (`shardings`: the distributed optimizer, Megatron FSDP's ZeRO-2 and
    ZeRO-3, offload) that fits this layout, kept; more sharding only adds communication. (None
    when none fits, and how many were planned.)"""
    variants = shardings(planner.searcher.cfg, fields[1])
    if planner.far_beyond(fields):
        return None, len(variants)
    for planned, (fsdp, offload) in enumerate(variants, start=1):
        if planner.plan(Candidate(*fields, fsdp, offload)):
            return ("offload" if offload else fsdp), planned
    return None, len(variants)


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
            for fsdp, offload in _smallest(bigger, pp):
                cheapest = Candidate(tp, pp, None, first, last, cp, ep, etp, 1, tp > 1, "full",
                                     True, fsdp, offload)
                if searcher.evaluate(cheapest, timed=False).fits:
                    return nodes, cheapest
    return None

"""Does the worst rank fit, what fills it, and which single change would make it fit.

A suggestion is a real, validated configuration planned again, not a rule of thumb: each
candidate (recompute, distributed optimizer, ZeRO-3-style sharding, a smaller micro-batch, more
TP inside the node, more PP) is applied to the config, checked by the project's validation
rules (a candidate that breaks one is dropped) and re-planned; those that lower the worst
rank's peak are listed with it, the ones that fit first. `check_fits` is what `pretrain.py`
calls before launch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.plan.build import Plan, PlanOptions, make_plan, stage_plans
from recipes.plan.cluster import ClusterSpec, recipe_cluster
from recipes.plan.memory import sharding_of

GB = 1e9
# Bytes a 64-bit process can address: a rank that needs more cannot run on any machine.
ADDRESS_SPACE_BYTES = 2**64


def size_text(value: float) -> str:
    """'12.55 GB', or '866.3 kB' / '3.41 MB' for the tiny recipes, '1.28 TB' / '3.20 PB' for
    layouts far too big, and beyond 1,000 PB GB in scientific notation ('6.4e+16 GB')."""
    if value >= 1e18:
        return f"{value / GB:.2g} GB"
    for unit, scale, shown_from in (("PB", 1e15, 1e15), ("TB", 1e12, 1e12), ("GB", 1e9, 1e8),
                                    ("MB", 1e6, 1e5), ("kB", 1e3, 0)):
        if value >= shown_from:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:g} B"


@dataclass(frozen=True)
class Suggestion:
    change: str  # the overrides to type, e.g. 'train.recompute=full'
    peak: float  # worst-rank peak bytes after the change
    fits: bool


def _set(cfg: Any, **fields: Any) -> Any:
    new = copy.deepcopy(cfg)
    for dotted, value in fields.items():
        section, name = dotted.split("__")
        setattr(getattr(new, section), name, value)
    return new


def _candidates(cfg: Any) -> list[tuple[str, Callable[[], Any], str | None]]:
    """(overrides, config builder, sharding) for each single change worth trying."""
    p, t, layout = cfg.parallel, cfg.train, cfg.layout
    found: list[tuple[str, Callable[[], Any], str | None]] = []
    if t.recompute != "selective" and t.recompute != "full":
        found.append(("train.recompute=selective", lambda: _set(cfg, train__recompute="selective"),
                      None))
    if t.recompute != "full":
        found.append(("train.recompute=full", lambda: _set(cfg, train__recompute="full"), None))
    if not cfg.optimizer.distributed:
        found.append(("optimizer.distributed=true",
                      lambda: _set(cfg, optimizer__distributed=True), None))
    # Each change names every field it sets, so the words applied as written train what was
    # priced (Megatron FSDP and offload exclude each other: sharding_rules.py).
    if cfg.optimizer.fsdp != "optim_grads_params":
        no_offload = " optimizer.cpu_offload=false" if cfg.optimizer.cpu_offload else ""
        found.append((f"optimizer.distributed=true optimizer.fsdp=optim_grads_params{no_offload} "
                      "(Megatron FSDP, ZeRO-3)",
                      lambda: _set(cfg, optimizer__distributed=True,
                                   optimizer__fsdp="optim_grads_params",
                                   optimizer__cpu_offload=False), None))
    if not cfg.optimizer.cpu_offload and cfg.precision.dtype != "fp32":
        no_fsdp = " optimizer.fsdp=none" if cfg.optimizer.fsdp != "none" else ""
        found.append((f"optimizer.distributed=true{no_fsdp} optimizer.cpu_offload=true (optimizer "
                      "state in CPU memory)", lambda: _set(cfg, optimizer__distributed=True,
                                                           optimizer__fsdp="none",
                                                           optimizer__cpu_offload=True), None))
    if t.micro_batch_size > 1:
        smaller = t.micro_batch_size // 2
        found.append((f"train.micro_batch_size={smaller}",
                      lambda: _set(cfg, train__micro_batch_size=smaller), None))
    if p.tensor * 2 <= cfg.cluster.gpus_per_node:
        found.append((f"parallel.tensor={p.tensor * 2} parallel.sequence_parallel=true",
                      lambda: _set(cfg, parallel__tensor=p.tensor * 2,
                                   parallel__sequence_parallel=True), None))
    if layout.data_parallel % 2 == 0:
        found.append((f"parallel.pipeline={p.pipeline * 2}",
                      lambda: _set(cfg, parallel__pipeline=p.pipeline * 2), None))
    return found


def _worst_peak(cfg: Any, cluster: ClusterSpec, options: PlanOptions) -> float:
    return max(s.peak for s in stage_plans(cfg, cluster, options))


def what_if_config(cfg: Any, options: PlanOptions) -> Any:
    """The config the planner's `sharding=` and `offload=true` ask about, written into its
    optimizer fields (as `optimizer.distributed`, `optimizer.fsdp`, `optimizer.cpu_offload`
    would train it): what the suggestions change, and what the sharding rules judge."""
    sharding = sharding_of(cfg, options.sharding)
    fields = {"optimizer__distributed": sharding != "none",
              "optimizer__fsdp": sharding if sharding not in ("none", "dist_opt") else "none"}
    if options.offload:
        fields["optimizer__cpu_offload"] = True
    return _set(cfg, **fields) if options.sharding is not None or options.offload else cfg


def what_if_words(options: PlanOptions) -> str:
    """The planner's what-ifs as typed, e.g. 'sharding=optim_grads_params offload=true'."""
    return " ".join(([f"sharding={options.sharding}"] if options.sharding else [])
                    + (["offload=true"] if options.offload else [])
                    + (["fp8_weights=true"] if options.fp8_weights else []))


def sharding_what_if_problem(cfg: Any, options: PlanOptions) -> str | None:
    """`sharding=` or `offload=true` whose run the project refuses to train (every rule of
    `recipes/config/sharding_rules.py`: Megatron FSDP with PP or an async save, offload under
    FSDP or of fp32 weights, ...): priced, it would be a figure of no run. Its words are the
    rule's own, so the plan refuses what training refuses, as training says it."""
    from recipes.config.sharding_rules import SHARDING_RULES

    if options.sharding is None and not options.offload:
        return None
    changed = what_if_config(cfg, options)
    for rule in SHARDING_RULES:
        problem = rule(changed)
        if problem:
            asked = what_if_words(dataclasses.replace(options, fp8_weights=False))
            return f"{asked} plans a run Megatron refuses: {problem}"
    return None


def fp8_weights_problem(cfg: Any, options: PlanOptions) -> str | None:
    """`fp8_weights=true` prices FP8 weights refreshed from an FP32 master copy, which Megatron's
    distributed optimizer keeps only for bf16/fp16 weights (`optimizer/distrib_optimizer.py:
    401-462`); an fp32 run's optimizer steps the weights themselves (`:466-474`), so there is
    no master to price and the FP8 weights would be all the weights there are."""
    if not options.fp8_weights or cfg.precision.dtype != "fp32":
        return None
    return (f"fp8_weights=true with precision.dtype={cfg.precision.dtype}: FP8 weights are "
            "refreshed from the FP32 master copy Megatron's optimizer keeps for bf16/fp16 "
            "weights only (distrib_optimizer.py:401; fp32 weights are stepped in place, "
            ":466); add precision.dtype=bf16, or drop fp8_weights=")


WHAT_IF_RULES = (sharding_what_if_problem, fp8_weights_problem)


def what_if_problem(cfg: Any, options: PlanOptions) -> str | None:
    """The first of the planner's what-ifs (`sharding=`, `offload=true`, `fp8_weights=true`)
    that would price a run Megatron or the project refuses (`WHAT_IF_RULES`); None when they
    all describe a run that trains."""
    for rule in WHAT_IF_RULES:
        problem = rule(cfg, options)
        if problem:
            return problem
    return None


def suggestions(plan: Plan) -> list[Suggestion]:
    """Single changes, validated and re-planned, that lower the worst rank's peak (one that
    raises it, e.g. offload from ZeRO-3, whose weights and gradients return unsharded, is no
    help, and is left out), fitting ones first, lowest peak first. The planner's what-ifs are
    written into the config first, so a change of sharding or offload is priced as the
    change, not overridden by them."""
    from recipes.config.validation import validate

    found = []
    base = what_if_config(plan.cfg, plan.options)
    plain = dataclasses.replace(plan.options, sharding=None, offload=False)
    for change, build, sharding in _candidates(base):
        candidate = build()
        try:
            validate(candidate)
        except ConfigError:
            continue
        options = plain if sharding is None else _with_sharding(plain, sharding)
        peak = _worst_peak(candidate, plan.cluster, options)
        if peak >= plan.worst.peak:
            continue
        found.append(Suggestion(change, peak, peak <= plan.cluster.gpu_memory_bytes))
    return sorted(found, key=lambda s: (not s.fits, s.peak))


def _with_sharding(options: PlanOptions, sharding: str) -> PlanOptions:
    from dataclasses import replace

    return replace(options, sharding=sharding)


def top_contributors(plan: Plan, n: int = 3) -> list[tuple[str, float]]:
    return plan.worst.contributors()[:n]


MTP_DEPTHS = "MTP depths"  # the contributor `build.StagePlan.contributors` names so
LOGITS_AND_LOSS = "logits and loss"  # likewise: the main head's inputs and logits


def logits_note(plan: Plan, name: str) -> str:
    """What to say after a contributor's size: for the MTP depths, how much of them is their
    FP32 logits (`activations.mtp_logits_bytes`; at a long sequence nearly all of it), where
    the main head's are a contributor of their own ('logits and loss'), which names the BF16
    logits held beside their FP32 copy while the loss runs (`activations.cast_logits_bytes`);
    else nothing."""
    from recipes.plan.activations import cast_logits_bytes, mtp_logits_bytes

    if name == MTP_DEPTHS:
        logits = mtp_logits_bytes(plan.cfg)
        return f" ({size_text(logits)} of it their FP32 logits)" if logits else ""
    cast = cast_logits_bytes(plan.cfg) if name == LOGITS_AND_LOSS else 0.0
    return f" ({size_text(cast)} of it the BF16 logits beside their FP32 copy)" if cast else ""


def contributor_text(plan: Plan, name: str, size: float) -> str:
    """A contributor in words: its name, its size and `logits_note`."""
    return f"{name} {size_text(size)}{logits_note(plan, name)}"


def cpu_rank_cluster(cfg: Any, host_bytes: int) -> tuple[ClusterSpec, str]:
    """The recipe's cluster with each rank given its share of this machine's memory (CPU ranks
    are processes on one host, not GPUs of `cluster.gpu_memory_gib`), and the words that say so."""
    ranks = min(cfg.layout.world_size, cfg.layout.gpus_per_node)
    cluster = dataclasses.replace(recipe_cluster(cfg), gpu_memory_gb=host_bytes / ranks / GB,
                                  host_memory_gb=host_bytes / GB)
    return cluster, f"this machine's memory per CPU rank: {host_bytes / GB:.1f} GB / {ranks}"


def _memory_text(plan: Plan, memory_of: str | None) -> str:
    return size_text(plan.cluster.gpu_memory_bytes) + (f" ({memory_of})" if memory_of else "")


def summary_line(plan: Plan, memory_of: str | None = None) -> str:
    """One line for the start of a run: layout, worst rank against memory (a GPU's, or what
    `memory_of` names), bubble, batch."""
    w, b = plan.worst, plan.batch
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    return (
        f"plan: {plan.cfg.layout.describe()} on {plan.cfg.layout.nodes} x "
        f"{plan.cfg.layout.gpus_per_node}; worst rank (stage {w.stage}) {size_text(w.peak)} of "
        f"{_memory_text(plan, memory_of)}, {verdict} (model state "
        f"{size_text(w.state.total)}, activations {size_text(w.activations.total)}); bubble "
        f"{(plan.bubble_interleaved or plan.bubble_1f1b).fraction_of_step:.1%}; global batch "
        f"{b.global_batch} ({b.tokens_per_step:,} tokens); a save holds "
        f"{size_text(plan.save_host_per_node)} of CPU memory per node"
    )


def layout_warnings(cfg: Any, cluster: ClusterSpec | None = None) -> list[str]:
    """The layout's warnings (TP or CP groups across nodes, recipes/plan/spanning.py) on
    `cluster` (default: the recipe's own nodes on the H100 file's network)."""
    return make_plan(cfg, cluster or recipe_cluster(cfg), PlanOptions(listed_groups=0)).warnings


def local_attention_cost(cfg: Any) -> str:
    """The score memory Megatron Core's unfused local attention keeps, in words."""
    from recipes.plan.activations import attention_score_bytes

    return (f"{size_text(attention_score_bytes(cfg))} per layer and micro-batch at seq_length "
            f"{cfg.model.seq_length}")


def local_attention_note(cfg: Any) -> str:
    """What the local layers cost on GPUs: their attention keeps the whole score matrix."""
    return (f"note: model.transformer_impl=local runs Megatron Core's unfused attention on the "
            f"GPUs, which keeps its scores: {local_attention_cost(cfg)} (Transformer Engine's "
            "fused attention keeps none; install the gpu extra for it)")


def _sequence_unit(cfg: Any) -> int:
    """What every sequence length must be a multiple of at this layout: 2 x CP chunks (when
    CP > 1), each split over TP with sequence parallel (recipes/config/validation.py)."""
    p = cfg.parallel
    return (2 * p.context if p.context > 1 else 1) * (p.tensor if p.sequence_parallel else 1)


def longest_fitting_sequence(plan: Plan) -> int | None:
    """The largest `model.seq_length` below the plan's whose worst rank fits at this layout
    (memory grows with the sequence, so a bisection finds it), or None when none does."""
    from recipes.config.validation import validate

    unit = _sequence_unit(plan.cfg)

    def fits(units: int) -> bool:
        candidate = _set(plan.cfg, model__seq_length=units * unit)
        return _worst_peak(candidate, plan.cluster, plan.options) <= plan.cluster.gpu_memory_bytes

    low, high = 0, plan.cfg.model.seq_length // unit  # fits(low) (none), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    if low == 0:
        return None
    longest = _set(plan.cfg, model__seq_length=low * unit)
    try:
        validate(longest)
    except ConfigError:
        return None
    return low * unit


def refusal(plan: Plan, memory_of: str | None = None) -> str:
    """The one-line reason a layout cannot run, naming its biggest contributors and a fix: a
    single change that fits, else the longest sequence that fits at this layout (the line then
    leads with `model.seq_length`), else more model parallelism. A rank needing more than a
    64-bit process can address is said to fit no machine."""
    w, seq = plan.worst, plan.cfg.model.seq_length
    parts = ", ".join(contributor_text(plan, name, size)
                      for name, size in top_contributors(plan))
    holder = (f"a rank has {_memory_text(plan, memory_of)}" if memory_of else
              f"a GPU has {size_text(plan.cluster.gpu_memory_bytes)} (cluster.gpu_memory_gib)")
    if w.peak > ADDRESS_SPACE_BYTES:
        holder += (f", and no machine can hold it (a 64-bit process addresses at most "
                   f"{size_text(ADDRESS_SPACE_BYTES)})")
    what, fixes = "the layout", [s.change for s in suggestions(plan) if s.fits][:2]
    if fixes:
        hint = f"try {' or '.join(fixes)}"
    elif (longest := longest_fitting_sequence(plan)) is not None:
        what = f"model.seq_length={seq}"
        hint = (f"at this layout model.seq_length={longest} fits at most, or split each "
                "sequence over more ranks (parallel.context, or parallel.tensor with "
                "parallel.sequence_parallel=true)")
    else:
        hint = "more TP/PP or fewer tokens per micro-batch"
    return (f"{what} needs {size_text(w.peak)} on a rank of pipeline stage {w.stage} but "
            f"{holder}; largest: {parts}; {hint} (scripts/plan.py shows the whole plan)")


def save_refusal(plan: Plan) -> str:
    """The one-line reason a layout's checkpoint save cannot fit a node's CPU memory."""
    fmt = plan.cfg.checkpoint.optimizer_format
    gather = (" (fully_reshardable gathers the whole fp32 optimizer state of each rank's TP x "
              "PP share onto every rank: 12 bytes per parameter)" if fmt == "fully_reshardable"
              and plan.sharding == "dist_opt" else "")
    fix = ("set checkpoint.optimizer_format=dp_reshardable (no gather; a resume may then change "
           "DP only), or raise TP x PP" if gather else "raise TP x PP or DP")
    return (f"a checkpoint save holds {size_text(plan.save_host_per_node)} of CPU memory per "
            f"node{gather} but a node has {plan.cluster.host_memory_gb:.0f} GB (host_memory_gb, "
            f"{plan.cluster.name}); {fix}")


def check_fits(cfg: Any, cluster: ClusterSpec | None = None, attention: str | None = None,
               memory_of: str | None = None) -> Plan:
    """Plan the run on its own cluster section; raise ConfigError if the worst rank cannot fit,
    or if a checkpoint save cannot fit a node's CPU memory (where the cluster file says it).

    Called before launch (attention='explicit' on CPU, where Megatron's local attention keeps
    the scores); returns the plan so the caller can print `summary_line(plan)`.
    """
    options = PlanOptions(listed_groups=0, attention=attention)
    plan = make_plan(cfg, cluster or recipe_cluster(cfg), options)
    if not plan.fits:
        raise ConfigError(refusal(plan, memory_of))
    if cfg.checkpoint.save and not plan.save_fits_host:
        raise ConfigError(save_refusal(plan))
    return plan


# What a launch's memory depends on, beyond the model and the cluster: a phase that changes
# one of these is planned and checked on its own.
PHASE_MEMORY_FIELDS = (("model", "seq_length"), ("parallel", "context"), ("data", "documents"),
                       ("train", "micro_batch_size"), ("train", "global_batch_size"))


def same_memory_layout(one: Any, other: Any) -> bool:
    """Whether two configs of one run take the same memory (`PHASE_MEMORY_FIELDS` equal)."""
    return all(getattr(getattr(one, section), name) == getattr(getattr(other, section), name)
               for section, name in PHASE_MEMORY_FIELDS)


def phase_launches(cfg: Any, from_step: int = 0) -> list[tuple[Any, Any, int]]:
    """A run in phases as its launches (the first phase's, then each relaunch phase's, which
    scripts/launch.py submits as jobs of their own and pretrain.py starts one after the
    other): (the phase that starts it, the config it trains with, the step it ends at), those
    that end after `from_step` (a resume plans what is left). None without phases."""
    from recipes.config.phases import launch_end, launch_starts, phase_config, phase_spans

    if not cfg.phases:
        return []
    spans = phase_spans(cfg)
    launches = [(span, phase_config(cfg, span), launch_end(spans, span.start_step))
                for span in launch_starts(spans)]
    return [launch for launch in launches if launch[2] > from_step]


def phase_launch_name(cfg: Any, span: Any) -> str:
    """`phases[2] (long_context_1m), the launch from step 993,404 with model.seq_length=...`:
    the phase and the overrides its launch starts with."""
    from recipes.config.phases import relaunch_overrides

    return (f"phases[{span.index}] ({span.name}), the launch from step {span.start_step:,} "
            f"with {' '.join(relaunch_overrides(span))}")


def phase_fit_problems(cfg: Any, cluster: Any = None, attention: str | None = None,
                       memory_of: str | None = None, from_step: int = 0) -> list[str]:
    """A run's fit is each launch's: every launch of a run in phases whose layout is not the
    config's own (already checked as `check_fits` checks it) is planned in its phase's
    sequence, CP, micro-batch and batch, and one that cannot fit is one line naming the phase,
    its worst rank against the memory and the planner's fix (`recipes.plan.fit.refusal`)."""
    problems = []
    for span, phase_cfg, _ in phase_launches(cfg, from_step):
        if same_memory_layout(phase_cfg, cfg):
            continue
        try:
            check_fits(phase_cfg, cluster, attention=attention, memory_of=memory_of)
        except ConfigError as error:
            problems.append(f"{phase_launch_name(cfg, span)} cannot fit: {error}")
    return problems

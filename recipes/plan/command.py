"""`scripts/plan.py`: plan a recipe on a cluster, in this process, starting no ranks.

The planner's own options (`cluster=FILE`, `sharding=`, `offload=`, `attention=`,
`fp8_weights=`, `tokens=`, `mfu=`, `groups=`, `verify=`, `--json`) are parsed by the entry
contract (trainer/entry/commands.py, PLAN); the rest is a recipe or saved config and
overrides, resolved and validated exactly as `pretrain.py` resolves them. `verify=true` also
builds every distinct shard on the meta device (the dry run) and checks the plan's parameter
counts against the real model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import as_written
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import apply_cluster, given_gpu_memory, load_cluster, recipe_cluster
from recipes.plan.fit import what_if_problem
from recipes.plan.memory import offload_option_note


def plan_options(values: dict[str, Any]) -> PlanOptions:
    """The planner's options as parsed from the command line (trainer/entry/commands.py, PLAN),
    named as `PlanOptions` names them."""
    names = {"tokens": "token_budget", "groups": "listed_groups"}
    fields = {f.name for f in dataclasses.fields(PlanOptions)}
    return PlanOptions(**{names.get(key, key): value for key, value in values.items()
                          if names.get(key, key) in fields})


def shard_world(cfg: Any) -> Any:
    """The same shards on the fewest ranks: DP and CP change no rank's weights, so the world
    shrinks to TP x PP x the least DP the expert grid needs (Megatron's parallel-state set-up,
    which creates every group of the world, is what makes a 16,384-rank dry run slow)."""
    layout = cfg.layout
    expert_ranks = layout.expert_tensor_size * layout.expert
    dp = math.lcm(layout.tensor, expert_ranks) // layout.tensor
    world = layout.tensor * layout.pipeline * dp
    gpus = math.gcd(world, layout.gpus_per_node)
    cluster = dataclasses.replace(cfg.cluster, nodes=world // gpus, gpus_per_node=gpus)
    parallel = dataclasses.replace(cfg.parallel, context=1)
    train = dataclasses.replace(cfg.train, global_batch_size=cfg.train.micro_batch_size * dp)
    return dataclasses.replace(cfg, cluster=cluster, parallel=parallel, train=train)


def compare_shards(plan: Any, shards: list[Any], seconds: float) -> list[str]:
    """The verify line: each built shard's parameters (the dry run's count) against the plan."""
    wrong = [f"stage {s.coords.pp}, TP {s.coords.tp}, EP {s.coords.ep}: real {s.parameters:,}"
             f", plan {plan.stages[s.coords.pp].params.distinct(s.coords.tp):,}"
             for s in shards
             if s.parameters != plan.stages[s.coords.pp].params.distinct(s.coords.tp)]
    verdict = "equal" if not wrong else f"{len(wrong)} differ: " + "; ".join(wrong[:3])
    return [f"verify: {len(shards)} distinct shards built on the meta device in {seconds:.1f} s;"
            f" per-rank parameters of plan and real model: {verdict}"]


Verifier = Callable[[Any], list[Any]]  # config -> the dry run's shards (torch; scripts/plan.py)


def _verify(plan: Any, build_shards: Verifier | None) -> list[str]:
    if build_shards is None:
        raise ConfigError("verify=true needs the dry run; run it through scripts/plan.py")
    start = time.perf_counter()
    shards = build_shards(shard_world(plan.cfg))
    return compare_shards(plan, shards, time.perf_counter() - start)


MegatronReader = Callable[[str, Any], tuple[Any, list[str]]]  # file, cluster -> config, notes


def megatron_config(rest: Sequence[str], path: str, cluster_file: str | None,
                    read: MegatronReader | None) -> tuple[Any, list[str]]:
    """`megatron_args=FILE`: the config Megatron-LM's parser reads from the file, on the whole
    cluster file's world (else one node of TP x PP x CP ranks), then the overrides in `rest`,
    validated as a recipe is."""
    from recipes.config.overrides import apply_overrides
    from recipes.config.schema import ClusterConfig
    from recipes.config.validation import validate
    from recipes.resolve import parse_args

    if read is None:
        raise ConfigError("megatron_args= needs Megatron-LM's parser; run it through "
                          "scripts/plan.py")
    parsed = parse_args(rest)
    if parsed.recipe or parsed.config:
        raise ConfigError("give megatron_args=FILE or a recipe=/config=, not both; "
                          "section.field=value overrides apply to either")
    cluster = None
    if cluster_file:
        spec = load_cluster(cluster_file)
        cluster = ClusterConfig(nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                                gpu_memory_gib=spec.gpu_memory_gb * 1e9 / 2**30)
    cfg, notes = read(path, cluster)
    cfg = apply_overrides(cfg, parsed.overrides)
    validate(cfg)
    return cfg, notes


# config, the layouts to run with their search ranks, steps -> lines
Confirmer = Callable[[Any, list[tuple[int, Any]], int], list[str]]
# cluster, dtype, file, the recipe (its CPU threads and layers) -> lines to print
Calibrator = Callable[[Any, str, str, Any], list[str]]


# The planner's what-ifs of one layout: the search varies the sharding and offload itself.
WHAT_IFS = ("sharding", "offload", "fp8_weights")
# What only the one-layout plan prints (steps and GPU-hours, its step estimate, its groups).
PLAN_ONLY = {"tokens": "the plan's training steps and GPU-hours for a token budget",
             "mfu": "the plan's compute-bound step estimate (the search times each layout "
                    "with its own step model)",
             "groups": "how many of the plan's process groups are written out (a search "
                       "writes out none)"}


# The rules below take the planner's options (every one, the entry contract fills the defaults
# in) and which of them the user gave: an option the command would ignore is refused when
# given, at its default value as at any other, and never for a default filled in.
Given = Collection[str]


def confirm_needs_search(options: dict[str, Any], given: Given) -> str | None:
    """`confirm=K` runs the search's layouts: without `search=true` there are none."""
    if "confirm" in given and not options.get("search"):
        return (f"confirm={options['confirm']} runs the layout search's layouts; add "
                "search=true, or drop confirm=")
    return None


def spread_needs_confirm(options: dict[str, Any], given: Given) -> str | None:
    """`confirm_pick=` picks the layouts `confirm=K` runs: without them, nothing."""
    if "confirm_pick" in given and not options.get("confirm"):
        return (f"confirm_pick={options['confirm_pick']} picks the layouts confirm=K runs; add "
                "confirm=K, e.g. confirm=6")
    return None


def confirm_steps_needs_confirm(options: dict[str, Any], given: Given) -> str | None:
    """`confirm_steps=N` is the length of each `confirm=K` run: without one it is ignored."""
    if "confirm_steps" in given and not options.get("confirm"):
        return (f"confirm_steps={options['confirm_steps']} is the steps of each confirm=K run; "
                "add search=true confirm=K (e.g. confirm=6), or drop confirm_steps=")
    return None


def top_needs_search(options: dict[str, Any], given: Given) -> str | None:
    """`top=N` is how many layouts the search lists: a plan of one layout lists none."""
    if "top" in given and not options.get("search"):
        return (f"top={options['top']} is how many layouts the layout search lists; add "
                "search=true, or drop top=")
    return None


def calibrate_alone(options: dict[str, Any], given: Given) -> str | None:
    """`calibrate=true` writes the cluster file and returns: a search or verify after it in the
    same command would be skipped. A value, not a given option, is refused: `calibrate=false`
    or `search=false` skips nothing."""
    if options.get("calibrate") and (options.get("search") or options.get("verify")):
        other = "search=true" if options.get("search") else "verify=true"
        return (f"calibrate=true only measures this machine and writes the cluster file; run "
                f"{other} in a second command, after it")
    return None


def verify_without_search(options: dict[str, Any], given: Given) -> str | None:
    """`verify=true` builds the shards of the one layout planned; a search plans many.
    `verify=false` with a search asks for what it does (no shards built): not refused."""
    if options.get("search") and options.get("verify"):
        return ("verify=true builds the shards of the one layout planned, not of a search's; "
                "drop search=true, or verify the layout it picks in a second command")
    return None


def search_without_what_ifs(options: dict[str, Any], given: Given) -> str | None:
    """`sharding=`, `offload=` and `fp8_weights=` price one layout as if it trained so (at
    their defaults too: the search tries offload whatever `offload=false` says); the search
    would price every layout so yet label it and write its command with its own sharding,
    training what was not priced. The search varies the sharding itself (the distributed
    optimizer, Megatron FSDP's optim_grads and optim_grads_params at PP 1, offload with
    bf16/fp16 weights: `search.shardings`), and prices a run's own FP8 parameters."""
    if not options.get("search"):
        return None
    for key in WHAT_IFS:
        if key not in given:
            continue
        value = as_written(options[key])
        if key == "fp8_weights":
            return (f"fp8_weights={value} is a what-if of one layout, which the search's "
                    "commands would not train; search a run that keeps FP8 parameters itself (the "
                    "FP8 plugin's param_gather setting), or drop fp8_weights=")
        return (f"{key}={value} prices one layout; search=true tries the sharding itself (the "
                "distributed optimizer, Megatron FSDP's optim_grads and optim_grads_params at "
                "PP 1, then offload) and writes each layout's optimizer.fsdp and "
                f"optimizer.cpu_offload into its command: drop {key}=, or plan the layout it "
                f"picks with {key}= in a second command")
    return None


def search_without_plan_only(options: dict[str, Any], given: Given) -> str | None:
    """`tokens=`, `mfu=` and `groups=` change only what the one-layout plan prints; the
    search prints none of it, so they would be ignored."""
    if not options.get("search"):
        return None
    for key, what in PLAN_ONLY.items():
        if key in given:
            return (f"{key}={as_written(options[key])} sets {what}, which search=true does not "
                    f"print; drop {key}=, or plan the layout it picks with {key}= in a second "
                    "command")
    return None


SEARCH_OPTION_RULES = (confirm_needs_search, spread_needs_confirm, confirm_steps_needs_confirm,
                       top_needs_search, calibrate_alone, verify_without_search,
                       search_without_what_ifs, search_without_plan_only)


def search_option_problem(options: dict[str, Any], given: Given | None = None) -> str | None:
    """The first planner option that this command line would ignore, or whose plan would not
    be the run it names (`SEARCH_OPTION_RULES`, one rule each); None when all apply. `given`:
    the options the user typed (None: every one in `options`)."""
    given = frozenset(options if given is None else given)
    for rule in SEARCH_OPTION_RULES:
        problem = rule(options, given)
        if problem:
            return problem
    return None


def phase_plans(cfg: Any, cluster: Any, options: PlanOptions, plan: Any) -> list[tuple]:
    """Each launch of a run in phases with its plan (`plan`, the config's own, where the
    launch trains in the config's layout), for the planner's line per phase."""
    from recipes.plan.fit import phase_launches, same_memory_layout

    found = []
    for span, phase_cfg, end in phase_launches(cfg):
        same = same_memory_layout(phase_cfg, cfg)
        found.append((span, end, plan if same else make_plan(phase_cfg, cluster, options)))
    return found


def dry_run_problem(cfg: Any) -> str | None:
    """`dry_run=true` is `pretrain.py`'s: it builds the run on the meta device instead of
    training. plan.py never trains, so it would be accepted and do nothing."""
    if getattr(cfg, "dry_run", False):
        return ("dry_run=true is pretrain.py's (build every rank on the meta device, no "
                "training); plan.py never trains: drop it, or add verify=true to build every "
                "distinct shard on the meta device and check the plan against them")
    return None


def run_plan(rest: Sequence[str], options: dict[str, Any], given: Given | None = None, *,
             as_json: bool = False, build_shards: Verifier | None = None,
             read_megatron: MegatronReader | None = None,
             confirm: Confirmer | None = None, calibrate: Calibrator | None = None) -> int:
    """The whole planner command; every user mistake is a ConfigError (one line, exit 2).
    `rest` is the recipe or saved config and its overrides, `options` the planner's own
    (`cluster`, `verify` and the `PlanOptions`; `top` with `search`, `confirm_steps` with
    `confirm`), `given` those the user typed (None: every one in `options`). `build_shards` is
    the dry run (the torch side, handed in by the command: recipes/ stays below trainer/)."""
    from recipes.plan.report import json_report, phase_fit_lines, phase_fits_json, text_report
    from recipes.resolve import resolve_config

    start = time.perf_counter()
    problem = search_option_problem(options, given)
    if problem:
        raise ConfigError(problem)
    cluster_file, notes = options.get("cluster"), []
    if options.get("megatron_args"):
        cfg, notes = megatron_config(rest, options["megatron_args"], cluster_file,
                                     read_megatron)
        if not as_json and notes:  # none: no empty line before the plan
            print("\n".join(f"megatron_args: {note}" for note in notes))
    elif options.get("search"):
        from recipes.resolve import build_config

        cfg = build_config(rest)
    else:
        cfg = resolve_config(rest)
    problem = dry_run_problem(cfg)
    if problem:
        raise ConfigError(problem)
    cluster = (given_gpu_memory(load_cluster(cluster_file), cfg, rest) if cluster_file
               else recipe_cluster(cfg))
    argv = list(rest)  # the user's command line, which the search's pretrain command keeps
    if cluster_file:
        placed = apply_cluster(cfg, cluster)
        if placed.cluster.gpus_per_node != cfg.cluster.gpus_per_node:
            argv += [f"cluster.nodes={placed.cluster.nodes}",
                     f"cluster.gpus_per_node={placed.cluster.gpus_per_node}"]
        cfg = placed
    if options.get("calibrate"):
        if calibrate is None or not cluster_file:
            raise ConfigError("calibrate=true measures this machine against a cluster file's "
                              "peak; run it through scripts/plan.py with cluster=FILE")
        print("\n".join(calibrate(cluster, cfg.precision.dtype, cluster_file, cfg)))
        return 0
    problem = what_if_problem(cfg, plan_options(options))
    if problem:
        raise ConfigError(problem)
    if options.get("search"):
        return run_search(cfg, cluster, options, as_json=as_json, confirm=confirm, argv=argv)
    plan = make_plan(cfg, cluster, plan_options(options))
    note = offload_option_note(cfg, plan.options.offload)
    if note:
        plan = dataclasses.replace(plan, notes=[*plan.notes, note])
    verify = bool(options.get("verify"))
    if as_json:
        report = json_report(plan)
        if verify:
            report["verify"] = _verify(plan, build_shards)
        report["phases"] = phase_fits_json(phase_plans(cfg, cluster, plan.options, plan))
        report["megatron_args_notes"] = notes
        report["seconds"] = time.perf_counter() - start
        json.dump(report, sys.stdout)
        print()
        return 0
    print(text_report(plan))
    for line in phase_fit_lines(phase_plans(cfg, cluster, plan.options, plan)):
        print(line)  # a run in phases: whether each launch fits
    if verify:
        print("\n".join(_verify(plan, build_shards)))
    print(f"planned in {time.perf_counter() - start:.2f} s")
    return 0


def no_layout_error(cfg: Any) -> ConfigError:
    """The one line for a world no layout of the model can use at all: whatever TP, PP, CP and
    EP the model allows, the data-parallel size left cannot split the global batch into whole
    micro-batches (a world far too large, or one of awkward factors). Memory is not what is
    short, so a larger cluster is no answer."""
    t, layout = cfg.train, cfg.layout
    return ConfigError(
        f"no layout of {cfg.name}'s model can use {layout.world_size:,} GPUs with "
        f"train.global_batch_size={t.global_batch_size}: the TP, PP, CP and EP sizes the model "
        "allows leave a data-parallel size the batch cannot split into whole micro-batches; "
        "change cluster.nodes (fewer, or a count whose GPUs divide the batch) or "
        "train.global_batch_size")


def no_fit_error(cfg: Any, cluster: Any) -> ConfigError:
    """The one line for a model that fits in no layout: the smallest cluster that would do."""
    from recipes.plan.search import LARGEST_CLUSTER_GPUS, smallest_fitting_world

    layout = cfg.layout
    here = (f"no layout of {cfg.name}'s model fits {layout.world_size:,} GPUs of "
            f"{cluster.gpu_memory_gb:g} GB ({cluster.name})")
    found = smallest_fitting_world(cfg, cluster)
    if found is None:
        return ConfigError(f"{here}, nor any cluster of these GPUs up to "
                           f"{LARGEST_CLUSTER_GPUS:,}; shorten model.seq_length or shrink the "
                           "model")
    nodes, candidate = found
    return ConfigError(f"{here}; the smallest cluster that fits is {nodes:,} nodes x "
                       f"{layout.gpus_per_node} ({nodes * layout.gpus_per_node:,} GPUs, e.g. "
                       f"{candidate.describe()}): set cluster.nodes={nodes}")


def run_search(cfg: Any, cluster: Any, options: dict[str, Any], *, as_json: bool,
               confirm: Confirmer | None = None, argv: Sequence[str] = ()) -> int:
    """`search=true`: every accepted layout that fits, ranked by modeled step time; with
    `confirm=K` the top K (or K spread over the ranking) are run for a few steps each and
    re-ranked by measured time."""
    from recipes.plan.search import search
    from recipes.plan.search_report import json_search, text_search

    result = search(cfg, cluster, dataclasses.replace(plan_options(options), listed_groups=0),
                    top=options["top"])
    if not result.enumerated:
        raise no_layout_error(cfg)
    if not result.listed:
        raise no_fit_error(cfg, cluster)
    own = own_layout_line(cfg, cluster, result)
    if as_json:
        json.dump({**json_search(cfg, cluster, result, argv), "own_layout": own}, sys.stdout)
        print()
    else:
        print(text_search(cfg, cluster, result, argv))
        print(own)
    if options.get("confirm"):
        if confirm is None:
            raise ConfigError("confirm= runs layouts; run it through scripts/plan.py")
        picked = confirm_layouts(cfg, result, options["confirm"], options.get("confirm_pick"))
        print(f"confirm: {len(picked)} layouts, "
              + ("spread over" if options.get("confirm_pick") == "spread" else "the top of")
              + f" the {len(result.fitting)} that fit (search ranks "
              + ", ".join(str(rank) for rank, _ in picked) + ")", flush=True)
        lines = confirm(cfg, picked, options["confirm_steps"])
        print("\n".join(lines))
    return 0


def confirm_layouts(cfg: Any, result: Any, k: int, pick: str | None) -> list[tuple[int, Any]]:
    """The layouts `confirm=K` runs, each with its rank among those that fit: the top K listed
    (`confirm_pick=top`, choosing a layout), or K spread over the whole ranking
    (`confirm_pick=spread`, checking the step model: `recipes.plan.search.spread`)."""
    from recipes.plan.search import spread

    if pick == "spread":
        return spread(result, k)
    rank = {id(e): i + 1 for i, e in enumerate(result.fitting)}
    return [(rank[id(e)], e) for e in result.listed[:k]]


def own_layout_line(cfg: Any, cluster: Any, result: Any) -> str:
    """Where the recipe's (or the Megatron-LM script's) own layout ranks in the search."""
    from recipes.config.validation import validate
    from recipes.plan.build import te_layers_on
    from recipes.plan.search import _recompute_overrides, candidate_of, place, recompute_choices
    from recipes.plan.search_report import lost_by

    candidate = candidate_of(cfg)
    try:
        validate(cfg)
    except ConfigError as error:
        return f"its own layout ({candidate.describe()}): refused here ({error})"
    rank, evaluated = place(cfg, cluster, result, candidate)
    written, written_peak, changed = candidate.describe(), evaluated.peak, ""
    choices = recompute_choices(cfg, te_layers_on(cfg, cluster))
    after = choices.index(candidate.recompute) + 1 if candidate.recompute in choices else (
        choices.index("full") if "full" in choices else len(choices))
    for more in choices[after:]:
        if rank is not None:
            break
        candidate = dataclasses.replace(candidate, recompute=more)
        rank, evaluated = place(cfg, cluster, result, candidate)
        changed = (f"; peak {written_peak / 1e9:.1f} GB of {cluster.gpu_memory_gb:g} GB as "
                   f"written, fits with {' '.join(_recompute_overrides(more))}")
    if rank is None:
        return (f"its own layout ({written}): does not fit even with full recompute, peak "
                f"{evaluated.peak / 1e9:.1f} GB of {cluster.gpu_memory_gb:g} GB")
    best = result.listed[0]
    return (f"its own layout ({written}{changed}): rank {rank:,} of {len(result.fitting):,}"
            f" that fit, {evaluated.seconds:.3f} s modeled against the best's "
            f"{best.seconds:.3f} s (+{evaluated.seconds / best.seconds - 1:.1%}; most lost to "
            f"{lost_by(evaluated, best) or 'nothing'})")

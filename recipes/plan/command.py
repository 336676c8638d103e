"""`scripts/plan.py`: plan a recipe on a cluster, in this process, starting no ranks.

The planner's own options (`cluster=FILE`, `sharding=`, `offload=`, `attention=`,
`fp8_weights=`, `tokens=`, `mfu=`, `groups=`, `verify=`, `--json`) are taken off the command
line first; the rest is a recipe or saved config and overrides, resolved and validated exactly
as `pretrain.py` resolves them. `verify=true` also builds every distinct shard on the meta
device (the dry run) and checks the plan's parameter counts against the real model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import apply_cluster, load_cluster, recipe_cluster
from recipes.plan.memory import SHARDINGS

_BOOLS = {"true": True, "false": False}


@dataclass
class PlanArgs:
    options: dict[str, Any] = field(default_factory=dict)
    cluster: str | None = None
    as_json: bool = False
    verify: bool = False
    rest: list[str] = field(default_factory=list)


def _positive(key: str, value: str, kind: type) -> Any:
    try:
        number = kind(float(value)) if kind is int else kind(value)
    except ValueError:
        number = None
    if number is None or number <= 0:
        raise ConfigError(f"{key}={value} must be a positive number, e.g. {key}="
                          f"{'15e12' if key == 'tokens' else '0.4' if key == 'mfu' else '4'}")
    return number


def _flag(key: str, value: str) -> bool:
    if value.lower() not in _BOOLS:
        raise ConfigError(f"{key}={value} must be true or false")
    return _BOOLS[value.lower()]


def _choice(key: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key}={value} is not known; use one of {', '.join(allowed)}")
    return value


def parse_plan_args(argv: Sequence[str]) -> PlanArgs:
    """Split the planner's own options from the recipe and overrides."""
    parsed = PlanArgs()
    readers = {
        "sharding": lambda v: _choice("sharding", v, SHARDINGS),
        "offload": lambda v: _flag("offload", v),
        "attention": lambda v: _choice("attention", v, ("flash", "explicit")),
        "fp8_weights": lambda v: _flag("fp8_weights", v),
        "tokens": lambda v: _positive("tokens", v, int),
        "mfu": lambda v: _positive("mfu", v, float),
        "groups": lambda v: _positive("groups", v, int),
    }
    for arg in argv:
        key, sep, value = arg.partition("=")
        if arg == "--json":
            parsed.as_json = True
        elif sep and key == "cluster":
            parsed.cluster = value
        elif sep and key == "verify":
            parsed.verify = _flag(key, value)
        elif sep and key in readers:
            parsed.options[key] = readers[key](value)
        else:
            parsed.rest.append(arg)
    return parsed


def _options(values: dict[str, Any]) -> PlanOptions:
    names = {"tokens": "token_budget", "groups": "listed_groups"}
    return PlanOptions(**{names.get(key, key): value for key, value in values.items()})


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


def run_plan(argv: Sequence[str], build_shards: Verifier | None = None) -> int:
    """The whole planner command; every user mistake is a ConfigError (one line, exit 2).
    `build_shards` is the dry run (the torch side, handed in by the script: recipes/ stays
    below trainer/)."""
    from recipes.plan.report import json_report, text_report
    from recipes.resolve import resolve_config

    start = time.perf_counter()
    args = parse_plan_args(argv)
    cfg = resolve_config(args.rest, check_paths=False)
    cluster = load_cluster(args.cluster) if args.cluster else recipe_cluster(cfg)
    if args.cluster:
        cfg = apply_cluster(cfg, cluster)
    plan = make_plan(cfg, cluster, _options(args.options))
    if args.as_json:
        report = json_report(plan)
        if args.verify:
            report["verify"] = _verify(plan, build_shards)
        report["seconds"] = time.perf_counter() - start
        json.dump(report, sys.stdout)
        print()
        return 0
    print(text_report(plan))
    if args.verify:
        print("\n".join(_verify(plan, build_shards)))
    print(f"planned in {time.perf_counter() - start:.2f} s")
    return 0

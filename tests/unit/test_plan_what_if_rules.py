"""The planner refuses what it would price wrongly or ignore, each rule alone: what-ifs of one
layout under search=true, what-ifs Megatron would not train (the same FSDP and offload rules
as the config's validation, in their words), FP8 weights without an FP32 master, options a
command line would silently skip; and it prices what it is told: the command line's GPU
memory over a cluster file's, FP8 weights from one function, suggestions that lower the peak.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config import sharding_rules
from recipes.config.overrides import apply_overrides
from recipes.plan import command
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import CLUSTER_DIR, apply_cluster, given_gpu_memory, load_cluster
from recipes.plan.fit import (
    fp8_weights_problem,
    sharding_what_if_problem,
    suggestions,
    what_if_config,
    what_if_problem,
)
from recipes.plan.memory import fp8_weights_of, offload_option_note, state_bytes_of
from recipes.registry import get_recipe

H100 = CLUSTER_DIR / "h100_80gb_8x8.yaml"
CPU = str(Path(CLUSTER_DIR) / "cpu_local.yaml")
EIGHT_B_ON_ONE_NODE = ["recipe=llama3_8b_tp8_dp8", "cluster.nodes=1", "parallel.tensor=1",
                       "parallel.sequence_parallel=false", "precision.grad_reduce_in_fp32=false",
                       "train.global_batch_size=16"]
FP8_PARAMS = ["precision.dtype=bf16", "plugins.fp8.format=hybrid",
              "plugins.fp8.recipe=tensorwise", "plugins.fp8.param_gather=true",
              "optimizer.distributed=true"]


def _resolved(*args: str):
    from recipes.resolve import resolve_config

    return resolve_config(list(args))


# --- 2: search=true with a what-if of one layout ----------------------------------------------

@pytest.mark.parametrize(("key", "value"), [("sharding", "optim_grads_params"),
                                            ("sharding", "none"), ("offload", True),
                                            ("fp8_weights", True)])
def test_search_refuses_what_ifs_of_one_layout(key, value) -> None:
    problem = command.search_without_what_ifs({"search": True, key: value}, {"search", key})
    assert problem.startswith(f"{key}={str(value).lower()} ")
    assert command.search_without_what_ifs({key: value}, {key}) is None  # a plan of one layout
    assert command.search_option_problem({"search": True, key: value}) == problem


def test_search_what_if_refusal_names_how_the_search_shards() -> None:
    """The search offers what the refusal says: FSDP's ZeRO-2/3 at PP 1 and offload (bf16)."""
    from recipes.plan.search import shardings

    words = command.search_without_what_ifs({"search": True, "sharding": "optim_grads"},
                                             {"search", "sharding"})
    assert "optim_grads and optim_grads_params at PP 1, then offload" in words
    cfg = get_recipe("llama3_8b_tp8_dp8")
    assert shardings(cfg, 1) == [("none", False), ("optim_grads", False),
                                 ("optim_grads_params", False), ("none", True)]
    fp8 = command.search_without_what_ifs({"search": True, "fp8_weights": True},
                                           {"search", "fp8_weights"})
    assert "param_gather setting" in fp8


def test_search_refusal_is_one_line_from_run_plan() -> None:
    with pytest.raises(ConfigError, match=r"^sharding=optim_grads_params prices one layout"):
        command.run_plan(["recipe=tiny_tp2_pp2"], {"cluster": CPU, "search": True,
                                                   "sharding": "optim_grads_params"})


def test_search_prices_each_candidate_at_its_own_sharding() -> None:
    """A what-if handed to the search itself changes no figure: each layout's label and
    command name its sharding, and that is what it is priced at."""
    from recipes.plan.search import search
    from recipes.resolve import build_config

    cfg = apply_cluster(build_config(["recipe=tiny_tp2_pp2", "precision.dtype=bf16"]),
                        load_cluster(CPU))
    cluster = load_cluster(CPU)
    plain = search(cfg, cluster, PlanOptions(listed_groups=0), top=5)
    asked = search(cfg, cluster, PlanOptions(listed_groups=0, sharding="optim_grads_params",
                                             offload=True), top=5)
    assert [(e.candidate, e.peak) for e in asked.listed] == \
        [(e.candidate, e.peak) for e in plain.listed]


# --- 3: what-ifs run the same FSDP rules training runs ----------------------------------------

def test_fsdp_what_if_with_pipeline_is_refused_in_the_rules_words() -> None:
    cfg = _resolved("recipe=8b_tp8_pp4_dp2")
    options = PlanOptions(sharding="optim_grads_params")
    words = sharding_rules.check_fsdp_pipeline(what_if_config(cfg, options))
    assert words and "parallel.pipeline=4" in words
    assert sharding_what_if_problem(cfg, options) == (
        f"sharding=optim_grads_params plans a run Megatron refuses: {words}")
    assert what_if_problem(cfg, options) == sharding_what_if_problem(cfg, options)


def test_fsdp_what_if_with_async_save_is_refused() -> None:
    cfg = _resolved(*EIGHT_B_ON_ONE_NODE, "checkpoint.async_save=true")
    options = PlanOptions(sharding="optim_grads")
    words = sharding_rules.check_fsdp_async_save(what_if_config(cfg, options))
    assert words and sharding_what_if_problem(cfg, options).endswith(words)
    assert sharding_what_if_problem(cfg, PlanOptions(sharding="dist_opt")) is None


def test_fsdp_what_if_at_pp1_is_taken() -> None:
    cfg = _resolved(*EIGHT_B_ON_ONE_NODE)
    assert sharding_what_if_problem(cfg, PlanOptions(sharding="optim_grads_params")) is None
    assert sharding_what_if_problem(cfg, PlanOptions()) is None


# --- 9: FP8 weights need a master; one function says which weights are FP8 ---------------------

def test_fp8_weights_of_an_fp32_run_are_refused() -> None:
    fp32 = get_recipe("tiny_tp2_pp2")
    assert fp32.precision.dtype == "fp32"
    problem = fp8_weights_problem(fp32, PlanOptions(fp8_weights=True))
    assert problem.startswith("fp8_weights=true with precision.dtype=fp32: ")
    assert "precision.dtype=bf16" in problem
    assert fp8_weights_problem(fp32, PlanOptions()) is None
    bf16 = apply_overrides(fp32, ["precision.dtype=bf16"])
    assert fp8_weights_problem(bf16, PlanOptions(fp8_weights=True)) is None
    assert what_if_problem(fp32, PlanOptions(fp8_weights=True)) == problem


def test_one_function_says_which_weights_are_fp8() -> None:
    from recipes.plan.gemm_weights import stage_low_precision_weights
    from recipes.plan.params import stage_params

    bf16 = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=bf16"])
    (count,), (low,) = stage_params(bf16), stage_low_precision_weights(bf16)
    assert fp8_weights_of(bf16, count, low, state_bytes_of(bf16)) == (low, 2)
    assert low.dense == 0  # no plugin: none
    assert fp8_weights_of(bf16, count, low, state_bytes_of(bf16, True)) == (count, 1)
    fp8 = apply_overrides(get_recipe("tiny_dp1"), FP8_PARAMS)
    (low8,) = stage_low_precision_weights(fp8)
    assert low8.dense > 0
    assert fp8_weights_of(fp8, count, low8, state_bytes_of(fp8)) == (low8, 1)


def test_a_save_copies_fp8_weights_at_the_dtype_either_way() -> None:
    """Megatron's writer dequantizes FP8 weights before the copy to the host: the save figure
    is the BF16 run's with the what-if and with FP8 parameters alike."""
    cluster = load_cluster(H100)
    bf16 = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=bf16",
                                                    "optimizer.distributed=true"])
    plain = make_plan(bf16, cluster, PlanOptions(listed_groups=0))
    what_if = make_plan(bf16, cluster, PlanOptions(listed_groups=0, fp8_weights=True))
    own = make_plan(apply_overrides(get_recipe("tiny_dp1"), FP8_PARAMS), cluster,
                    PlanOptions(listed_groups=0))
    assert what_if.worst.save_host == plain.worst.save_host == own.worst.save_host
    assert what_if.worst.state.weights == plain.worst.state.weights / 2  # GPU: 1 byte each
    assert plain.worst.state.weights > own.worst.state.weights > what_if.worst.state.weights


# --- 10: options a command line would skip ----------------------------------------------------

@pytest.mark.parametrize(("rule", "options", "expected"), [
    (command.top_needs_search, {"top": 5},
     "top=5 is how many layouts the layout search lists; add search=true, or drop top="),
    (command.confirm_steps_needs_confirm, {"confirm_steps": 3},
     "confirm_steps=3 is the steps of each confirm=K run; add search=true confirm=K (e.g. "
     "confirm=6), or drop confirm_steps="),
    (command.search_without_plan_only, {"search": True, "tokens": 10**6},
     "tokens=1000000 sets the plan's training steps and GPU-hours"),
    (command.search_without_plan_only, {"search": True, "mfu": 0.5}, "mfu=0.5 sets "),
    (command.search_without_plan_only, {"search": True, "groups": 2}, "groups=2 sets "),
])
def test_options_that_would_be_ignored_are_refused(rule, options, expected) -> None:
    assert rule(options, set(options)).startswith(expected)
    assert command.search_option_problem(options) == rule(options, set(options))


@pytest.mark.parametrize(("options", "typed"), [
    ({"top": 10, "confirm_steps": 6, "mfu": 0.4}, ()),  # defaults the entry contract fills in
    ({"search": True, "top": 5}, None),
    ({"search": True, "confirm": 2, "confirm_steps": 3}, None),
    ({"tokens": 10**6, "mfu": 0.5, "groups": 2}, None),  # a plan of one layout prints them
])
def test_options_that_apply_pass(options, typed) -> None:
    assert command.search_option_problem(options, typed) is None


def test_dry_run_is_refused_by_the_planner() -> None:
    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), ["dry_run=true"])
    assert command.dry_run_problem(cfg).startswith("dry_run=true is pretrain.py's")
    assert command.dry_run_problem(get_recipe("tiny_tp2_pp2")) is None
    with pytest.raises(ConfigError, match=r"^dry_run=true is pretrain.py's"):
        command.run_plan(["recipe=tiny_tp2_pp2", "dry_run=true"], {})


def test_the_command_lines_gpu_memory_wins_over_the_cluster_file(capsys) -> None:
    spec = load_cluster(H100)
    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), ["cluster.gpu_memory_gib=40"])
    assert given_gpu_memory(spec, cfg, ["recipe=tiny_tp2_pp2", "cluster.gpu_memory_gib=40"]
                            ).gpu_memory_gb == pytest.approx(40 * 2**30 / 1e9)
    assert given_gpu_memory(spec, cfg, ["recipe=tiny_tp2_pp2"]) == spec  # the recipe's: file
    command.run_plan(["recipe=tiny_tp2_pp2", "cluster.gpu_memory_gib=40"],
                     {"cluster": str(H100), "groups": 1}, as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["cluster"]["gpu_memory_gb"] == pytest.approx(40 * 2**30 / 1e9)


def test_offload_of_a_run_offloading_a_part_says_what_is_priced() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp2_bf16_offload"), ["optimizer.offload_fraction=0.5"])
    note = offload_option_note(cfg, True)
    assert note.startswith("offload=true: priced at the run's own optimizer.offload_fraction=0.5")
    assert offload_option_note(cfg, False) is None
    assert offload_option_note(get_recipe("tiny_dp2_bf16_offload"), True) is None  # all of it


# --- 14: suggestions lower the peak -----------------------------------------------------------

def test_suggestions_only_lower_the_peak() -> None:
    """From ZeRO-3 (docs/memory.md's arguments), offload returns weights and gradients
    unsharded and raises the peak: not suggested."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(_resolved(*EIGHT_B_ON_ONE_NODE), cluster)
    plan = make_plan(cfg, cluster, PlanOptions(listed_groups=0, sharding="optim_grads_params"))
    found = suggestions(plan)
    assert found and all(s.peak < plan.worst.peak for s in found)
    assert not any("cpu_offload=true" in s.change for s in found)

"""The layout search's pruning and memoising change its speed, not its answer: it ranks the
same layouts with the same figures as the exhaustive search (every layout planned in full,
nothing memoised) on dense, MoE, hybrid and hybrid-MoE recipes; every memoised figure is the
same for any two layouts that agree on the fields it is memoised on; and the benchmark that
times the two runs and checks them at toy size."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from recipes.plan.activations import stage_activations
from recipes.plan.build import (
    PlanOptions,
    attention_of,
    stage_states,
    stage_traffics,
    te_layers_on,
)
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.comm import traffic_sharding
from recipes.plan.memory import sharding_of
from recipes.plan.params import stage_layer_counts, stage_params
from recipes.plan.search import (
    ACTIVATIONS_DEPEND_ON,
    FORWARD_DEPENDS_ON,
    NEAR_MISS,
    PARAMS_DEPEND_ON,
    STATES_DEPEND_ON,
    TRAFFIC_DEPENDS_ON,
    apply_candidate,
    search,
)
from recipes.plan.search_report import near_misses
from recipes.plan.steptime import kind_forward_seconds
from recipes.registry import get_recipe
from tests.unit.test_plan_search import CPU, H100
from trainer.tools.benchmarks.search import first_difference, run_bench_search

# (recipe, cluster file, GPU memory in GB or None for the file's): memory small enough that
# some layouts fit, some lose by a little and some by far (what the pruning acts on).
PAIRS = [
    ("tiny_tp2_pp2", CPU, 0.004),
    ("mixtral_tiny_ep4_dp4", CPU, 0.005),  # MoE
    ("hybrid_tiny_tp2_sp", CPU, 0.004),  # hybrid Mamba-Transformer
    ("hybrid_tiny_ep2_dp2", CPU, 0.005),  # hybrid with an MoE layer
    ("nemotron_h_8b_tp2_sp_dp32", H100, None),  # a real hybrid on 64 H100s
]


def _setup(name: str, cluster_file, memory_gb: float | None):
    cluster = load_cluster(cluster_file)
    if memory_gb is not None:
        cluster = dataclasses.replace(cluster, gpu_memory_gb=memory_gb)
    cfg = get_recipe(name)
    return (apply_cluster(cfg, cluster) if cluster_file == H100 else cfg), cluster


def _figures(evaluated) -> tuple:
    return (evaluated.candidate, evaluated.seconds, evaluated.peak, evaluated.fits,
            evaluated.time.items(), evaluated.invalid)


@pytest.mark.parametrize(("name", "cluster_file", "memory_gb"), PAIRS,
                         ids=[pair[0] for pair in PAIRS])
def test_fast_search_answers_as_the_exhaustive_one(name, cluster_file, memory_gb) -> None:
    cfg, cluster = _setup(name, cluster_file, memory_gb)
    reference = search(cfg, cluster, top=10, exhaustive=True)
    fast = search(cfg, cluster, top=10)
    assert [_figures(e) for e in fast.listed] == [_figures(e) for e in reference.listed]
    assert [_figures(e) for e in fast.fitting] == [_figures(e) for e in reference.fitting]
    assert [_figures(e) for e in fast.invalid] == [_figures(e) for e in reference.invalid]
    assert ([_figures(e) for e in near_misses(cfg, fast, cluster)]
            == [_figures(e) for e in near_misses(cfg, reference, cluster)])
    close = NEAR_MISS * cluster.gpu_memory_bytes
    assert ([_figures(e) for e in fast.too_big]
            == [_figures(e) for e in reference.too_big if e.peak <= close])
    assert (fast.enumerated, fast.pruned_blocks, fast.dominated) == (
        reference.enumerated, reference.pruned_blocks, reference.dominated)
    # the pruning acted: layouts too big by far were skipped or sized only, never timed
    assert fast.skipped > 0 and fast.timed < fast.enumerated - fast.skipped
    assert reference.skipped == 0 and len(reference.listed) == 10


def test_with_no_layout_close_to_fitting_every_one_too_big_is_timed() -> None:
    """When nothing lost on memory by under a quarter, the report shows the fastest of all
    those that lost: the fast search then times every one, as the exhaustive one does."""
    cluster = dataclasses.replace(load_cluster(CPU), gpu_memory_gb=0.0081)
    cfg = get_recipe("tiny_dp1")
    reference = search(cfg, cluster, exhaustive=True)
    fast = search(cfg, cluster)
    assert reference.fitting and reference.too_big
    assert all(e.peak > NEAR_MISS * cluster.gpu_memory_bytes for e in reference.too_big)
    assert [_figures(e) for e in fast.too_big] == [_figures(e) for e in reference.too_big]
    assert [_figures(e) for e in fast.fitting] == [_figures(e) for e in reference.fitting]


def _memoised_figures(cfg, cluster, options):
    """Each memoised figure of a config, with the candidate fields it is memoised on."""
    params = stage_params(cfg)
    sharding = traffic_sharding(sharding_of(cfg, options.sharding))
    peak = cluster.peak_tflops[cfg.precision.dtype] * 1e12
    return {
        "params": (PARAMS_DEPEND_ON, (), lambda: (stage_layer_counts(cfg), params)),
        "activations": (ACTIVATIONS_DEPEND_ON, (),
                        lambda: stage_activations(cfg, attention_of(cluster, options),
                                                  te_layers_on(cfg, cluster))),
        "states": (STATES_DEPEND_ON, (), lambda: stage_states(cfg, options, params)),
        "traffic": (TRAFFIC_DEPENDS_ON, (sharding,),
                    lambda: stage_traffics(cfg, cluster, options, params)),
        "forward": (FORWARD_DEPENDS_ON, (),
                    lambda: kind_forward_seconds(cfg, peak, 0.75, 64.0)),
    }


MEMO_PAIRS = [*PAIRS[:4], ("tiny_dp2_bf16_offload", CPU, 0.005)]  # bf16: offload twins


@pytest.mark.parametrize(("name", "cluster_file", "memory_gb"), MEMO_PAIRS,
                         ids=[pair[0] for pair in MEMO_PAIRS])
def test_each_memoised_figure_depends_on_its_fields_only(name, cluster_file,
                                                        memory_gb) -> None:
    """Any two layouts the exhaustive search planned that agree on a figure's fields get the
    same figure, however they differ in the others (and for every figure some do: traffic
    depends on all but offload and the sharding's DP passes, so only a bf16 or fp16 run, whose
    layouts come with an offload twin, has two layouts that share it)."""
    cfg, cluster = _setup(name, cluster_file, memory_gb)
    options = PlanOptions(listed_groups=0)
    result = search(cfg, cluster, top=1, exhaustive=True)
    candidates = sorted({e.candidate for e in result.fitting + result.too_big}, key=repr)
    groups: dict[tuple, list] = defaultdict(list)
    for c in candidates:
        run = apply_candidate(cfg, c)
        for figure, (fields, extra, compute) in _memoised_figures(run, cluster, options).items():
            groups[figure, tuple(getattr(c, f) for f in fields), extra].append((c, compute()))
    varied = set()
    for key, members in groups.items():
        first_candidate, first = members[0]
        for c, value in members[1:]:
            assert value == first, (key, first_candidate, c)
            varied.add(key[0])
    shared_traffic = {"traffic"} if cfg.precision.dtype != "fp32" else set()
    assert varied == {"params", "activations", "states", "forward", *shared_traffic}


def test_a_different_ranking_is_named() -> None:
    cluster = dataclasses.replace(load_cluster(CPU), gpu_memory_gb=0.004)
    cfg = get_recipe("tiny_tp2_pp2")
    reference, fast = search(cfg, cluster, top=5), search(cfg, cluster, top=5)
    assert first_difference(reference, fast) is None
    fast.listed[1], fast.listed[2] = fast.listed[2], fast.listed[1]
    assert first_difference(reference, fast).startswith("place 2: ")
    fast.listed.pop()
    fast.listed[1], fast.listed[2] = fast.listed[2], fast.listed[1]
    assert "exhaustive lists 5 layouts, search 4" in first_difference(reference, fast)


def test_bench_search_times_both_and_checks_the_ranking(capsys) -> None:
    code = run_bench_search(["recipe=mixtral_tiny_ep4_dp4"], str(CPU), top=5, repeats=1)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "exhaustive (reference) median" in out and "search / exhaustive:" in out
    assert "top 5: the same layouts in the same order" in out

"""Figures the docs quote from the planner are the planner's figures today: each doc sentence
below is rebuilt from a fresh plan and must stand in its page word for word, so a change of
the memory model, the search or the step arithmetic that moves a quoted figure fails here
rather than leaving the page behind."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.validation import validate
from recipes.plan.build import PlanOptions, make_plan, te_layers_on
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.command import run_plan
from recipes.plan.fit import size_text
from recipes.plan.search import apply_candidate, candidate_of, place, recompute_choices, search
from recipes.plan.search_report import near_misses
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
H100 = str(REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml")


def page(name: str) -> str:
    return " ".join((REPO / "docs" / name).read_text(encoding="utf-8").split())


def worst(args: list[str], **options):
    cluster = load_cluster(H100)
    return make_plan(apply_cluster(resolve_config(args), cluster), cluster,
                     PlanOptions(listed_groups=0, **options)).worst


def test_memory_page_quotes_the_fsdp_recipes_plan():
    fsdp = worst(["recipe=llama3_8b_fsdp_dp8"])
    ddp = worst(["recipe=llama3_8b_fsdp_dp8", "optimizer.fsdp=none"])
    quoted = (f"{size_text(fsdp.peak)} of 80 GB (model state {size_text(fsdp.state.total)}); "
              f"with `optimizer.fsdp=none`, {size_text(ddp.peak)} "
              f"({size_text(ddp.state.total)})")
    assert quoted in page("memory.md")


def test_memory_page_quotes_the_one_gpu_search(capsys):
    args = ["recipe=llama3_8b_tp8_dp8", "cluster.nodes=1", "cluster.gpus_per_node=1",
            "parallel.tensor=1", "parallel.sequence_parallel=false",
            "train.global_batch_size=16"]
    assert run_plan(args, {"cluster": H100, "search": True, "top": 3}, as_json=True) == 0
    first = json.loads(capsys.readouterr().out)["top"][0]
    quoted = f"prints `{first['layout']}` first, at {first['peak_bytes'] / 1e9:.1f} GB of 80 GB"
    assert quoted in page("memory.md")


def test_search_page_quotes_the_no_fit_line():
    with pytest.raises(ConfigError) as error:
        run_plan(["recipe=llama31_405b_tp8_pp16_dp128", "cluster.nodes=2"],
                 {"cluster": H100, "search": True, "top": 10})
    assert f"error: {error.value}" in page("search.md")


def test_planner_page_quotes_the_405b_token_budget():
    cfg = resolve_config(["recipe=llama31_405b_tp8_pp16_dp128"])
    cluster = load_cluster(H100)
    batch = make_plan(apply_cluster(cfg, cluster), cluster,
                      PlanOptions(listed_groups=0, token_budget=int(15.6e12))).batch
    quoted = (f"{batch.steps:,} steps of {batch.tokens_per_step / 1e6:.1f}M tokens, "
              f"{batch.gpu_hours / 1e6:.1f}M GPU-hours")
    assert quoted in page("planner.md")


SUPER = "recipe=nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"
SUPER_1M = ["recipe=nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16", "phases=[]",
            "data.blend=conf/data/nemotron3_super_long_context.yaml",
            "train.global_batch_size=16", "model.seq_length=1048576",
            "data.documents=concatenate", "train.micro_batch_size=1"]


def test_super_recipes_quote_their_plans():
    """Nemotron 3 Super's notes (its recipe, and the generated page) quote the 8k run's
    activations with and without full recompute, and its 1M-token stage at TP4 x CP16 (its
    phase) and in NVIDIA's TP2 x CP64 layout on 128 GPUs."""
    full, none = worst([SUPER]), worst([SUPER, "train.recompute=none"])
    phase = worst([*SUPER_1M, "parallel.context=16"])
    nvidia = worst([*SUPER_1M, "parallel.tensor=2", "parallel.context=64", "cluster.nodes=16"])
    assert phase.peak > 80e9 > nvidia.peak  # the note says the phase does not fit
    text = page("nemotron.md")
    for quoted in (f"8k row ({none.activations.total / 1e9:.1f} GB a rank at TP4 + SP)",
                   f"full recompute keeps {full.activations.total / 1e9:.1f} GB",
                   f"(scripts/plan.py: {phase.peak / 1e9:.1f} GB a rank)",
                   f"it plans at {nvidia.peak / 1e9:.1f} GB a rank",
                   f"NVIDIA's TP2 x CP64 on 128 GPUs: {nvidia.peak / 1e9:.1f} GB)"):
        assert quoted in text


# docs/search.md's 70B and 8B figures. A search is the costly part (about a second for 70B):
# each is run once here, and a published layout of the same model, world and batch is placed
# in that ranking rather than searched again (the search sets every field their arguments
# change, so its ranking is the same).
LLAMA_70B = ("recipe=llama3_70b_tp4_pp4_cp2_vpp5_dp2",)
BRIDGE_70B = (*LLAMA_70B, "train.micro_batch_size=1", "parallel.pipeline=8",
              "parallel.context=1", "parallel.virtual_pipeline=5")
BRIDGE_8B = ("recipe=llama3_8b_tp8_dp8", "cluster.nodes=1", "train.global_batch_size=128",
             "train.micro_batch_size=1", "parallel.tensor=1", "parallel.sequence_parallel=false")


def configured(args: tuple[str, ...]):
    cluster = load_cluster(H100)
    return apply_cluster(resolve_config(list(args)), cluster), cluster


@functools.cache
def searched(args: tuple[str, ...]):
    """`scripts/plan.py ARGS cluster=h100_80gb_8x8.yaml search=true`'s ranking."""
    return search(*configured(args), PlanOptions(listed_groups=0), top=10)


def own_layout(args: tuple[str, ...], result):
    """The search's `its own layout` figures: the layout as written (too big), and its rank
    and plan with the least recompute that makes it fit."""
    cfg, cluster = configured(args)
    written = candidate_of(cfg)
    _, as_written = place(cfg, cluster, result, written)
    for choice in recompute_choices(cfg, te_layers_on(cfg, cluster))[1:]:
        rank, fitted = place(cfg, cluster, result, dataclasses.replace(written, recompute=choice))
        if rank is not None:
            return as_written, rank, fitted
    raise AssertionError(f"{args}: fits with no recompute choice")


def counts(result) -> tuple[str, str, str, str]:
    return (f"{result.enumerated:,}", f"{result.enumerated - result.skipped:,}",
            f"{result.timed:,}", f"{len(result.fitting):,}")


def test_search_page_quotes_the_70b_search():
    r = searched(LLAMA_70B)
    top, missed = r.listed, near_misses(configured(LLAMA_70B)[0], r, load_cluster(H100))[0]
    layouts, planned, timed, fit = counts(r)
    assert all(e.candidate.describe().startswith("TP8+SP") for e in top)
    assert {e.candidate.fsdp for e in top[:3]} == {"optim_grads_params"}
    assert {e.candidate.pipeline for e in top[3:]} == {2}
    assert dataclasses.replace(missed.candidate, fsdp="optim_grads_params") == top[0].candidate
    assert len({f"{e.peak / 1e9:.1f}" for e in top[:3]}) == 1  # one peak quoted for the three
    lead = max(e.time.compute - top[0].time.compute for e in top[3:])
    text = page("search.md")
    for quoted in (f"| Llama-3-70B, 64 (8 x 8), 5 runs | {layouts} | {planned} | {timed} | {fit} |",
                   f"Today the command prints {layouts} layouts ({planned} planned for memory, "
                   f"{timed} timed), {fit} fit",
                   f"{top[0].seconds:.3f} to {top[2].seconds:.3f} s, {top[0].peak / 1e9:.1f} GB; "
                   f"ZeRO-2 of the same misses at {missed.peak / 1e9:.1f} GB",
                   f"({top[3].seconds:.3f} to {top[9].seconds:.3f} s), each a compute term up to "
                   f"{lead:.2f} s larger"):
        assert quoted in text


def test_search_page_quotes_bridges_70b_layout():
    r = searched(LLAMA_70B)
    best = r.listed[0]
    as_written, rank, fitted = own_layout(BRIDGE_70B, r)
    assert best.candidate.describe() == "TP8+SP mbs2 rc-none fsdp-optim_grads_params"
    modules = fitted.candidate.recompute.removeprefix("selective:")
    quoted = (f"| {rank:,} of {len(r.fitting):,} ({as_written.peak / 1e9:.1f} GB as written; "
              f"selective `{modules}`) | {fitted.seconds:.3f} s | TP8+SP mbs2, no pipeline, "
              f"Megatron FSDP ZeRO-3, no recompute | {best.seconds:.3f} s | compute "
              f"+{fitted.time.compute - best.time.compute:.2f} s "
              f"({fitted.time.compute - as_written.time.compute:.2f} s of it the recompute, since "
              f"it misses 80 GB by {as_written.peak / 1e9 - 80:.1f} GB), bubble "
              f"+{fitted.time.bubble - best.time.bubble:.2f} s |")
    assert quoted in page("search.md")


def test_search_page_quotes_bridges_8b_layout():
    r = searched(BRIDGE_8B)
    best = r.listed[0]
    as_written, rank, fitted = own_layout(BRIDGE_8B, r)
    fsdp = worst(list(BRIDGE_8B), sharding="optim_grads_params")
    zero3 = (*BRIDGE_8B, "optimizer.distributed=true", "optimizer.fsdp=optim_grads_params")
    cfg, cluster = configured(zero3)
    zero3_rank, zero3_plan = place(cfg, cluster, r, candidate_of(cfg))
    assert best.candidate.describe() == "TP1 mbs1 rc-none fsdp-optim_grads"
    choice = fitted.candidate.recompute
    recompute = (f"selective `{choice.removeprefix('selective:')}`"
                 if choice.startswith("selective") else f"{choice} recompute")
    quoted = (f"| {rank:,} of {len(r.fitting):,} (with the distributed optimizer, as these "
              f"arguments plan it: {as_written.peak / 1e9:.1f} GB as written, fits with "
              f"{recompute}; with Megatron FSDP, `sharding=optim_grads_params`, the "
              f"planner puts it at {size_text(fsdp.peak)} without recompute) | "
              f"{fitted.seconds:.3f} s | TP1 mbs1, no recompute, Megatron FSDP ZeRO-2 "
              f"({best.peak / 1e9:.1f} GB): the published layout, at ZeRO-2 where Bridge runs "
              f"ZeRO-3 | {best.seconds:.3f} s | compute "
              f"+{fitted.time.compute - best.time.compute:.2f} s: the recompute the distributed "
              "optimizer needs. With `optimizer.distributed=true "
              f"optimizer.fsdp=optim_grads_params` added, it ranks {zero3_rank} of "
              f"{len(r.fitting):,} at {zero3_plan.seconds:.3f} s |")
    assert quoted in page("search.md")


# docs/search.md's three Llama 3.1 405B rows: each recipe's own layout placed in its own search.
class Row405(NamedTuple):
    result: Any
    best: Any
    fitted: Any
    written: str  # "| `ARGS` | RANK of FIT (PEAK GB as written;"
    modules: str  # the selective recompute that makes it fit
    bubble: str  # "bubble +X s: M micro-batches over P stages"


def row_405b(recipe: str) -> Row405:
    args = (f"recipe={recipe}",)
    r = searched(args)
    best = r.listed[0]
    as_written, rank, fitted = own_layout(args, r)
    assert not as_written.fits  # the row's recompute is what makes it fit
    layout = configured(args)[0].layout
    written = (f"| `{args[0]}` | {rank:,} of {len(r.fitting):,} "
               f"({as_written.peak / 1e9:.1f} GB as written;")
    bubble = (f"bubble +{fitted.time.bubble - best.time.bubble:.2f} s: {layout.microbatches} "
              f"micro-batches over {layout.pipeline} stages")
    return Row405(r, best, fitted, written,
                  fitted.candidate.recompute.removeprefix("selective:"), bubble)


def ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def fastest_without_pipeline(recipe: str, result) -> int:
    """The rank `top=` prints for the fastest fitting layout with PP 1 (a layout a validation
    rule refuses is not printed and takes no rank)."""
    cfg = configured((f"recipe={recipe}",))[0]
    rank = 0
    for e in result.fitting:
        try:
            validate(apply_candidate(cfg, e.candidate))
        except ConfigError:
            continue
        rank += 1
        if e.candidate.pipeline == 1:
            return rank
    raise AssertionError(f"{recipe}: no layout without a pipeline fits")


def test_search_page_quotes_the_405b_8192_gpu_layout():
    row = row_405b("llama31_405b_tp8_pp16_dp64")
    best, fitted = row.best, row.fitted
    assert best.candidate.describe() == "TP8+SP PP64(1/../1) CP8 mbs1 rc-none distopt"
    less = best.time.compute - fitted.time.compute
    quoted = (f"{row.written} fits with selective recompute of `{row.modules}`) | "
              f"{fitted.seconds:.3f} s | TP8+SP PP64 (1/../1 layers) CP8, no recompute | "
              f"{best.seconds:.3f} s | {row.bubble}, compute {-less:+.2f} s |")
    text = page("search.md")
    assert quoted in text
    pp1 = fastest_without_pipeline("llama31_405b_tp8_pp16_dp64", row.result)
    assert (f"the fastest PP 1 layout ranks {ordinal(pp1)} on {row.result.world:,} GPUs and"
            in text)


def test_search_page_quotes_the_405b_16384_gpu_layout():
    row = row_405b("llama31_405b_tp8_pp16_dp128")
    best = row.best
    assert best.candidate.describe() == "TP8+SP PP64(1/../1) CP8 mbs1 rc-none distopt"
    quoted = (f"{row.written} selective `{row.modules}`) | {row.fitted.seconds:.3f} s | "
              f"TP8+SP PP64 (1/../1) CP8, no recompute | {best.seconds:.3f} s | {row.bubble} |")
    text = page("search.md")
    assert quoted in text
    pp1 = fastest_without_pipeline("llama31_405b_tp8_pp16_dp128", row.result)
    assert f"GPUs and {ordinal(pp1)} on {row.result.world:,})" in text


def test_search_page_quotes_the_405b_128k_layout():
    row = row_405b("llama31_405b_128k_tp8_cp16_pp16_dp8")
    best = row.best
    assert best.candidate.describe() == "TP8+SP CP16 mbs1 rc-none fsdp-optim_grads_params"
    assert best.time.bubble == 0  # "the best has none"
    quoted = (f"{row.written} selective `{row.modules}`) | {row.fitted.seconds:.3f} s | "
              "TP8+SP CP16, no pipeline, Megatron FSDP ZeRO-3, no recompute | "
              f"{best.seconds:.3f} s | {row.bubble}; the best has none |")
    text = page("search.md")
    assert quoted in text
    # the paragraph after the table: this best's step is its compute alone
    exposed = best.time.total - best.time.compute
    assert (f"(no bubble, the FSDP gathers and reduce-scatters all hidden: {exposed:.3f} s "
            "exposed)" in text)

"""Figures the docs quote from the planner are the planner's figures today: each doc sentence
below is rebuilt from a fresh plan and must stand in its page word for word, so a change of
the memory model, the search or the step arithmetic that moves a quoted figure fails here
rather than leaving the page behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.command import run_plan
from recipes.plan.fit import size_text
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
H100 = str(REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml")


def page(name: str) -> str:
    return " ".join((REPO / "docs" / name).read_text(encoding="utf-8").split())


def worst(args: list[str]):
    cluster = load_cluster(H100)
    return make_plan(apply_cluster(resolve_config(args), cluster), cluster,
                     PlanOptions(listed_groups=0)).worst


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

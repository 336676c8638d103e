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

"""TP and CP groups that span nodes are a warning naming the inter-node traffic: in the plan,
the dry run's output and the launch (recipes/plan/spanning.py)."""

from __future__ import annotations

import copy

import pytest

from recipes.plan.build import make_plan
from recipes.plan.cluster import CLUSTER_DIR, recipe_cluster
from recipes.plan.fit import layout_warnings
from recipes.registry import get_recipe


def _on_nodes(name: str, nodes: int, gpus: int, **parallel):
    cfg = copy.deepcopy(get_recipe(name))
    cfg.cluster.nodes, cfg.cluster.gpus_per_node = nodes, gpus
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    return cfg


def test_tp8_on_nodes_of_4_gpus_warns_naming_the_inter_node_traffic():
    cfg = _on_nodes("llama3_8b_tp8_dp8", 16, 4)
    [line] = layout_warnings(cfg)
    assert line.startswith("warning: each TP group (8 ranks) spans 2 nodes of 4 GPUs, so its "
                           "all-gather + reduce-scatter (SP) (")
    assert "GB per rank per step) crosses the inter-node network: 50 GB/s per GPU instead of " \
        "450 GB/s inside a node" in line
    assert line.endswith("keep parallel.tensor <= 4 (the GPUs of a node) and span nodes with "
                         "parallel.pipeline or data parallelism")
    plan = make_plan(cfg, recipe_cluster(cfg))
    tp = [t for t in plan.worst.traffic if t.group == "tp"][0]
    assert f"({tp.bytes_sent / 1e9:.3g} GB per rank per step)" in line


def test_a_cp_group_across_nodes_warns_and_a_layout_inside_nodes_does_not():
    [line] = layout_warnings(_on_nodes("tiny_dp1", 2, 4, tensor=2, context=4))
    assert line.startswith("warning: each CP group (4 ranks) spans 2 nodes of 4 GPUs, so its K/V "
                           "ring exchange")
    assert "keep parallel.tensor x parallel.context <= 4" in line
    assert layout_warnings(_on_nodes("tiny_dp1", 2, 4, tensor=2, context=2)) == []
    assert layout_warnings(get_recipe("llama3_8b_tp8_dp8")) == []  # TP8 in nodes of 8


def test_plan_text_and_json_carry_the_warning():
    from recipes.plan.report import json_report, text_report

    plan = make_plan(_on_nodes("tiny_tp2", 2, 1), recipe_cluster(get_recipe("tiny_tp2")))
    assert text_report(plan).splitlines()[1].startswith("warning: each TP group (2 ranks) spans")
    assert json_report(plan)["warnings"] == plan.warnings != []


def test_dry_run_and_launch_print_the_warning(capsys, tmp_path):
    from trainer.tools.dry_run import run_dry_run

    run_dry_run(_on_nodes("tiny_tp2", 2, 1))
    assert capsys.readouterr().out.startswith("warning: each TP group (2 ranks) spans 2 nodes of 1")
    pytest.importorskip("nemo_run")
    from trainer.entry.commands import LAUNCH
    from trainer.entry.contract import parse_arguments
    from trainer.launch.cluster import launch_args, run_launch

    one_gpu = tmp_path / "one_gpu.yaml"
    text = (CLUSTER_DIR / "h100_80gb_8x8.yaml").read_text()
    one_gpu.write_text(text.replace("gpus_per_node: 8", "gpus_per_node: 1"))
    args = parse_arguments(LAUNCH, ["recipe=tiny_tp2", "data.source=synthetic",
                                    f"cluster={one_gpu}", "--dry-run", f"job_dir={tmp_path}"])
    assert run_launch(launch_args(args.options, args.flags, args.rest)) == 0
    out = capsys.readouterr().out
    assert out.startswith("warning: each TP group (2 ranks) spans 2 nodes of 1 GPUs")

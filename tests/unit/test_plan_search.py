"""The layout search: what it lists fits, passes validation and builds; its pruning loses no
winner; its step model moves the right way; a model that fits nowhere names the smallest
cluster; and the fast node-crossing test agrees with listing every group."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import save_config
from recipes.config.layout import GROUP_KINDS, Layout
from recipes.config.validation import validate
from recipes.plan.build import PlanOptions, stage_plans, te_layers_on
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.command import run_plan
from recipes.plan.search import (
    Candidate,
    _blocks,
    _Searcher,
    apply_candidate,
    candidate_of,
    pipeline_splits,
    place,
    recompute_choices,
    refusal,
    search,
)
from recipes.plan.steptime import step_time
from recipes.registry import get_recipe
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "conf" / "cluster" / "cpu_local.yaml"
H100 = REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml"


@pytest.fixture(scope="module")
def tiny_search():
    cfg, cluster = get_recipe("tiny_tp2_pp2"), load_cluster(CPU)
    return cfg, cluster, search(cfg, cluster, top=1000)


def test_every_listed_layout_fits_and_validates(tiny_search) -> None:
    cfg, cluster, result = tiny_search
    assert len(result.listed) >= 20
    for e in result.listed:
        validate(apply_candidate(cfg, e.candidate))
        assert e.fits and e.peak <= cluster.gpu_memory_bytes
    seconds = [e.seconds for e in result.listed]
    assert seconds == sorted(seconds)


def _every_variant(cfg, world, te_layers):
    """Brute force: every block, VPP, micro-batch, SP, optimizer (and its sharding) and
    recompute (by module too), no pruning; but for a dense model with TP, sequence parallel
    off, which the search counts as dominated and never plans (the step model leaves out the
    norms and residual adds every TP rank then repeats on all tokens, `search`), so its figure
    there can be the lower one."""
    moe = bool(cfg.model.num_moe_experts)
    for tp, pp, first, last, vpps, cp, ep, etp in _blocks(cfg, world):
        for vpp, mbs, sp, dist, rc in itertools.product(
                vpps, (1, 2, 4, 8), (False, True), (False, True),
                recompute_choices(cfg, te_layers)):
            if (sp and tp == 1) or (not sp and tp > 1 and not moe):
                continue
            for fsdp in ("none", "optim_grads", "optim_grads_params") if dist else ("none",):
                yield Candidate(tp, pp, vpp, first, last, cp, ep, etp, mbs, sp, rc, dist, fsdp)


@pytest.mark.parametrize("name", ["tiny_tp2_pp2", "mixtral_tiny_ep4_dp4"])
def test_pruning_loses_no_faster_valid_layout(name) -> None:
    cfg, cluster = get_recipe(name), load_cluster(CPU)
    cluster = dataclasses.replace(cluster, gpu_memory_gb=0.004)  # memory binds for tiny models
    result = search(cfg, cluster, top=1)
    searcher = _Searcher(cfg, cluster, PlanOptions(listed_groups=0))
    best = None
    for c in _every_variant(cfg, cfg.layout.world_size, te_layers_on(cfg, cluster)):
        if apply_candidate(cfg, c).layout.microbatches == 0:  # refused by validation anyway
            continue
        e = searcher.evaluate(c)
        if not e.fits or (best is not None and e.seconds >= best):
            continue
        try:
            validate(apply_candidate(cfg, c))
        except ConfigError:
            continue
        best = e.seconds
    assert result.listed and result.listed[0].seconds == pytest.approx(best)


def test_step_model_charges_recompute_tp_and_the_bubble() -> None:
    cfg = apply_cluster(get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2"), load_cluster(H100))
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel,
                                                                tp_comm_overlap=False))
    cluster = load_cluster(H100)

    def time_of(**changes):
        c = dataclasses.replace(candidate_of(cfg), **changes)
        run = apply_candidate(cfg, c)
        return step_time(run, stage_plans(run, cluster, PlanOptions()), 989)

    base = time_of()
    assert time_of(recompute="full").compute > time_of(recompute="selective").compute \
        > base.compute
    assert time_of(virtual=None).bubble > base.bubble
    assert time_of(tensor=8, context=1).tp > base.tp


def test_step_model_prices_tp_overlap_and_recompute_modules() -> None:
    """TP overlap hides TP's collectives behind the GEMMs (the recipe's, as Bridge's 70B);
    selective recompute of the MLP repeats its GEMMs beyond the attention core's."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2"), cluster)

    def time_of(cfg, **train):
        run = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))
        return step_time(run, stage_plans(run, cluster, PlanOptions()), 989)

    without = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel,
                                                                    tp_comm_overlap=False))
    assert time_of(cfg).tp < time_of(without).tp
    core = time_of(cfg, recompute="selective")
    mlp = time_of(cfg, recompute="selective", recompute_modules=["core_attn", "mlp"])
    norms = time_of(cfg, recompute="selective", recompute_modules=["core_attn", "layernorm"])
    assert mlp.compute > core.compute == norms.compute > time_of(cfg).compute


def test_step_model_hides_ep_traffic_behind_the_other_micro_batch_with_ep_overlap() -> None:
    """EP overlap hides the token exchange behind the other micro-batch's layers: less exposed
    EP time, and nothing else in the step changes."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(get_recipe("mixtral_8x7b_tp1_pp4_ep8_dp16"), cluster)

    def time_of(overlap: bool):
        run = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel,
                                                                    ep_comm_overlap=overlap))
        return step_time(run, stage_plans(run, cluster, PlanOptions()), 989)

    on, off = time_of(True), time_of(False)
    assert 0 <= on.ep < off.ep
    assert (on.compute, on.tp, on.dp) == (off.compute, off.tp, off.dp)


def test_uneven_pipeline_splits_include_the_llama_405b_one() -> None:
    splits = {(pp, first) for pp, first, _last, _v in pipeline_splits(126, 128)}
    assert (16, 7) in splits and (2, None) in splits and (16, None) not in splits


def test_published_layout_is_placed_among_the_fitting(tiny_search) -> None:
    cfg, cluster, result = tiny_search
    rank, evaluated = place(cfg, cluster, result, candidate_of(cfg))
    assert evaluated.fits and 1 <= rank <= len(result.fitting)


def test_model_that_fits_nowhere_names_the_smallest_cluster(capsys) -> None:
    with pytest.raises(ConfigError) as error:
        run_plan(["recipe=llama31_405b_tp8_pp16_dp128", "cluster.nodes=2"],
                 {"cluster": str(H100), "search": True, "top": 10})
    message = str(error.value)
    assert "\n" not in message
    assert "no layout of llama31_405b_tp8_pp16_dp128's model fits 16 GPUs" in message
    # with the optimizer state in the nodes' CPU memory (their 2 TB each hold it), 8 nodes
    assert "the smallest cluster that fits is 8 nodes x 8" in message
    assert "distopt+offload" in message


@pytest.mark.parametrize("nodes", [100_000, 1_000_000])
def test_a_world_no_layout_can_use_says_the_batch_not_a_bigger_cluster(nodes) -> None:
    with pytest.raises(ConfigError) as error:
        run_plan(["recipe=8b_tp8_pp4_dp2", f"cluster.nodes={nodes}"],
                 {"cluster": str(H100), "search": True, "top": 10})
    assert str(error.value).startswith(
        f"no layout of llama3_8b_tp8_pp4_dp2's model can use {nodes * 8:,} GPUs with "
        "train.global_batch_size=32: the TP, PP, CP and EP sizes the model allows leave a "
        "data-parallel size the batch cannot split into whole micro-batches")


def test_search_prints_the_table_and_the_command(capsys) -> None:
    assert run_plan(["recipe=tiny_tp2_pp2"], {"cluster": str(CPU), "search": True,
                                               "top": 3}) == 0
    out = capsys.readouterr().out
    assert "rank   step s" in out and "train the best: python scripts/pretrain.py" in out
    assert "its own layout (TP2 PP2 mbs2 rc-none ddp): rank " in out
    assert run_plan(["recipe=tiny_tp2_pp2"], {"cluster": str(CPU), "search": True, "top": 3},
                    as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["top"]) == 3 and data["top"][0]["fits"]


def test_the_best_layouts_command_keeps_the_users_command_line(capsys, tmp_path) -> None:
    """What the user set (the batch, the sequence, a saved config) is in the command that trains
    the best layout; the layout's own settings replace any the user gave."""
    given = ["recipe=tiny_tp2_pp2", "train.global_batch_size=8", "model.seq_length=64",
             "parallel.tensor=2", "train.global_batch_size=16"]
    assert run_plan(given, {"cluster": str(CPU), "search": True, "top": 3}, as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    command = data["train_command"].split()
    assert command[:5] == ["python", "scripts/pretrain.py", "recipe=tiny_tp2_pp2",
                           "model.seq_length=64", "train.global_batch_size=16"]
    assert command[5:] == data["top"][0]["overrides"]  # parallel.tensor as the layout sets it
    saved = tmp_path / "mine.yaml"
    save_config(dataclasses.replace(get_recipe("tiny_tp2_pp2"), name="mine"), saved)
    assert run_plan([f"config={saved}"], {"cluster": str(CPU), "search": True, "top": 3}) == 0
    assert f"train the best: python scripts/pretrain.py config={saved} parallel.tensor=" \
        in capsys.readouterr().out


def test_own_layout_line_gives_the_peak_as_written_not_of_a_recompute_tried() -> None:
    """The 405B as its recipe writes it does not fit 80 GB; the line names the plan's peak of
    that layout, while the recompute that makes it fit is found two tries later."""
    from recipes.plan.build import PlanOptions, make_plan
    from recipes.plan.command import own_layout_line
    from recipes.resolve import build_config

    cluster = load_cluster(H100)
    cfg = apply_cluster(build_config(["recipe=llama31_405b_tp8_pp16_dp128"]), cluster)
    result = search(cfg, cluster, PlanOptions(listed_groups=0), top=3)
    peak = make_plan(cfg, cluster, PlanOptions(listed_groups=0)).worst.peak
    line = own_layout_line(cfg, cluster, result)
    assert f"peak {peak / 1e9:.1f} GB of 80 GB as written, fits with " \
           "train.recompute=selective train.recompute_modules=[core_attn,mlp]" in line


@pytest.mark.parametrize("gpn,world", [(8, 64), (8, 48), (6, 36), (4, 32)])
def test_fast_node_crossing_equals_listing_every_group(gpn, world) -> None:
    for tp, cp, pp, ep, etp in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4), (1, 2, 3, 4),
                                                 (1, 2, 4), (None, 1)):
        if world % (tp * cp * pp):
            continue
        layout = Layout(nodes=world // gpn, gpus_per_node=gpn, tensor=tp, context=cp,
                        pipeline=pp, expert=ep, expert_tensor=etp)
        if world % layout.expert_model_parallel:
            continue
        for kind in GROUP_KINDS:
            brute = any(layout.crosses_nodes(g) for g in layout.groups(kind))
            assert layout.any_group_crosses_nodes(kind) == brute, (tp, cp, pp, ep, etp, kind)


def test_a_sample_of_listed_layouts_builds_in_the_dry_run() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "unit" / "search_probe.py"), "tiny_tp2_pp2",
         "mixtral_tiny_tp2_sp_ep2_dp2"], capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.splitlines()[-1])
    for name, rows in data.items():
        assert len(rows) == 2, name
        for row in rows:
            assert "parameters of plan and real model: equal" in row["verify"], (name, row)


@pytest.mark.parametrize("recipe", ["llama3_8b_fsdp_dp8", "nemotron_h_4b_tp1_dp64"])
def test_the_ranking_holds_only_layouts_validation_accepts(recipe):
    """Some rules see what the search's axes do not (the FP8 plugin's parameter gather against
    offload; Mamba heads per TP rank over CP): layouts that fit and that such a rule refuses
    leave the ranking, so that ranks and counts are of layouts that can be trained."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(get_recipe(recipe), cluster)
    found = search(cfg, cluster, top=5)
    assert found.refused > 0 and found.fitting
    for evaluated in found.fitting:
        validate(apply_candidate(cfg, evaluated.candidate))


def test_what_lost_on_memory_shows_only_layouts_validation_accepts():
    """The phased Nano's fastest near misses are Megatron FSDP layouts its fully reshardable
    checkpoint format refuses: the report's `best of what lost` passes over them."""
    from recipes.plan.search_report import LOSERS_SHOWN, near_misses

    cluster = load_cluster(H100)
    cfg = apply_cluster(get_recipe("nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16"), cluster)
    found = search(cfg, cluster, top=5)
    shown = near_misses(cfg, found, cluster)
    assert len(shown) == LOSERS_SHOWN
    for evaluated in shown:
        validate(apply_candidate(cfg, evaluated.candidate))
    fastest = found.too_big[:LOSERS_SHOWN]
    assert any(refusal(cfg, e.candidate) for e in fastest)


def test_a_layout_without_sequence_parallel_drops_tp_comm_overlap():
    """TP overlap needs sequence parallel: a TP1 layout of a recipe that overlaps is offered with
    the overlap off (in the config and in the command that trains it), not refused."""
    cluster = load_cluster(H100)
    cfg = apply_cluster(get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2"), cluster)
    assert cfg.parallel.tp_comm_overlap
    tp1 = Candidate(1, 8, None, None, None, 1, 1, None, 1, False, "full", True)
    validate(apply_candidate(cfg, tp1))
    assert "parallel.tp_comm_overlap=false" in tp1.overrides()
    assert not any(o.startswith("parallel.tp_comm_overlap") for o in
                   dataclasses.replace(tp1, tensor=8, sequence_parallel=True).overrides())


@pytest.mark.parametrize("recipe", ["hybrid_tiny_pp2_vpp2", "hybrid_tiny_pp2_pipes",
                                    "hybrid_tiny_pp2"])
def test_a_hybrid_search_lists_only_splits_its_pattern_allows(recipe):
    """A pattern cut by `|` fixes PP x VPP to its segments; one without takes no virtual stages:
    the search offers nothing Megatron (and the hybrid rules) would refuse, and does not crash
    on a split the segments cannot make."""
    from recipes.plan.search import search

    cfg = get_recipe(recipe)
    cluster = load_cluster("conf/cluster/cpu_local.yaml")
    found = search(apply_cluster(cfg, cluster), cluster, top=50)
    assert found.fitting and not found.refused
    pattern = cfg.model.hybrid_layer_pattern
    for evaluated in found.fitting:
        c = evaluated.candidate
        chunks = c.pipeline * (c.virtual or 1)
        assert chunks == pattern.count("|") + 1 if "|" in pattern else c.virtual is None


def test_a_layout_is_placed_where_the_search_lists_it():
    """The `its own layout` rank is the layout's place in the printed ranking, where an
    offloaded layout comes after every one that fits without it however fast its modeled
    step: a BF16 run on small GPUs has offloaded layouts faster than some that are not."""
    cluster = dataclasses.replace(load_cluster(CPU), gpu_memory_gb=0.005)
    cfg = get_recipe("tiny_dp2_bf16_offload")
    result = search(cfg, cluster, top=1)
    offloaded = [e.seconds for e in result.fitting if e.candidate.offload]
    assert offloaded and min(offloaded) < max(e.seconds for e in result.fitting
                                              if not e.candidate.offload)
    for listed, evaluated in enumerate(result.fitting, start=1):
        rank, placed = place(cfg, cluster, result, evaluated.candidate)
        ahead = sum(1 for e in result.fitting[:listed - 1] if e.ranking() == placed.ranking())
        assert rank == listed - ahead


def test_the_counted_twins_are_each_choices_ddp_layout_and_the_sp_off_variants():
    """What the report counts, not planned: one plain-DDP layout for each micro-batch and
    recompute choice planned, and with TP each planned variant with SP off, and its DDP one."""
    cluster = dataclasses.replace(load_cluster(CPU), gpu_memory_gb=0.004)
    result = search(get_recipe("tiny_tp2_pp2"), cluster, top=1, exhaustive=True)
    planned = {e.candidate for e in result.fitting + result.too_big}
    assert len(planned) == result.timed

    def ddp(c: Candidate) -> Candidate:
        return dataclasses.replace(c, distributed=False, fsdp="none", offload=False)

    sp_off = {dataclasses.replace(c, sequence_parallel=False) for c in planned if c.tensor > 1}
    assert sp_off and {c.tensor for c in planned} > {2}
    assert result.dominated == len({ddp(c) for c in planned | sp_off}) + len(sp_off)


def test_recompute_choices_try_the_norms_only_where_megatron_recomputes_one():
    """Local layers recompute every norm; Transformer Engine's layers only an MoE layer's own,
    and not where TE's graph of the router returns its output."""
    from recipes.config.overrides import apply_overrides

    norms = "selective:core_attn,layernorm"
    dense, moe = get_recipe("tiny_dp1"), get_recipe("mixtral_tiny_ep2_dp2")
    assert norms in recompute_choices(dense, te_layers=False)
    assert not any("layernorm" in c for c in recompute_choices(dense, te_layers=True))
    assert norms in recompute_choices(moe, te_layers=True)
    graphed = apply_overrides(moe, ["train.cuda_graphs=transformer_engine",
                                    "train.cuda_graph_modules=[moe_router]"])
    assert not any("layernorm" in c for c in recompute_choices(graphed, te_layers=True))
    with_preprocess = apply_overrides(graphed, ["train.cuda_graph_modules=[moe_router,"
                                                "moe_preprocess]"])
    assert norms in recompute_choices(with_preprocess, te_layers=True)

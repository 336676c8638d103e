"""Cluster files load and refuse bad keys in one line; the fit check refuses what cannot fit,
names the biggest contributors, and its suggestions really fit when applied."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.plan.build import PlanOptions, make_plan
from recipes.plan.cluster import CLUSTER_DIR, apply_cluster, load_cluster
from recipes.plan.fit import check_fits, suggestions, summary_line
from recipes.registry import RECIPES, get_recipe


@pytest.mark.parametrize("path", sorted(CLUSTER_DIR.glob("*.yaml")))
def test_cluster_files_load(path):
    spec = load_cluster(path)
    assert spec.gpu_memory_gb > 0 and set(spec.peak_tflops) == {"bf16", "fp16", "fp8", "fp32"}


def test_the_reference_8x8_cluster():
    spec = load_cluster(CLUSTER_DIR / "h100_80gb_8x8.yaml")
    assert (spec.nodes, spec.gpus_per_node, spec.gpu_memory_gb) == (8, 8, 80)
    assert spec.intra_node_gb_per_s > spec.inter_node_gb_per_s


@pytest.mark.parametrize(("edit", "message"), [
    (("gpus_per_node: 8", "gpu_per_node: 8"), "unknown key 'gpu_per_node'; did you mean"),
    (("gpu_memory_gb: 80", "gpu_memory_gb: -80"), "gpu_memory_gb=-80 must be a positive"),
    (("attention: flash", "attention: fast"), "attention='fast' must be flash or explicit"),
    (("  fp8: 1979\n", ""), "peak_tflops must give TFLOP/s for each of"),
    (("gpu_memory_gb: 80", "gpu_memory_gb: .nan"), "gpu_memory_gb=nan must be a positive finite"),
    (("gpu_memory_gb: 80", "gpu_memory_gb: .inf"), "gpu_memory_gb=inf must be a positive finite"),
    (("gpu_memory_gb: 80", "gpu_memory_gb: 80\ngpu_memory_gb: 40"),
     "key 'gpu_memory_gb' is given twice (line"),
    (("gpu_memory_gb: 80", "gpu_memory_gb: 80\ngemm_peak_fraction: 5"),
     "gemm_peak_fraction=5 is a share of the peak, at most 1"),
    (("name: h100_80gb_8x8", "name: ''"), "name='' must be text"),
])
def test_bad_cluster_files_are_one_line(tmp_path: Path, edit, message):
    text = (CLUSTER_DIR / "h100_80gb_8x8.yaml").read_text().replace(*edit)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_cluster(bad)


def test_apply_cluster_keeps_the_world_size():
    h200 = load_cluster(CLUSTER_DIR / "h200_1x8.yaml")
    cfg = apply_cluster(get_recipe("llama3_8b_tp8_dp8"), h200)
    assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node) == (8, 8)
    assert cfg.cluster.gpu_memory_gib * 2**30 == pytest.approx(141e9)
    tiny = apply_cluster(get_recipe("tiny_tp2_pp2"), h200)  # 4 ranks: part of one node
    assert (tiny.cluster.nodes, tiny.cluster.gpus_per_node) == (1, 4)
    twelve = copy.deepcopy(get_recipe("tiny_dp1"))
    twelve.cluster.nodes, twelve.cluster.gpus_per_node = 3, 4
    with pytest.raises(ConfigError, match="12 ranks do not fill nodes of 8 GPUs"):
        apply_cluster(twelve, h200)


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_registered_recipe_fits_its_own_cluster(name):
    plan = check_fits(get_recipe(name))
    assert plan.fits and summary_line(plan).startswith("plan: ")


def _too_big():
    cfg = copy.deepcopy(get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2"))
    cfg.train.micro_batch_size, cfg.train.global_batch_size = 4, 256
    return cfg


def test_refusal_names_contributors_and_a_fix():
    with pytest.raises(ConfigError) as error:
        check_fits(_too_big())
    line = str(error.value)
    assert "\n" not in line and "pipeline stage 0" in line and "activations" in line
    assert "try train.recompute=full" in line


def test_suggestions_that_claim_to_fit_do_fit_when_applied():
    cfg = _too_big()
    plan = make_plan(cfg, load_cluster(CLUSTER_DIR / "h100_80gb_8x8.yaml"))
    fitting = [s for s in suggestions(plan) if s.fits]
    assert fitting and not plan.fits
    full = copy.deepcopy(cfg)
    full.train.recompute = "full"
    replanned = make_plan(full, plan.cluster)
    assert replanned.fits
    full_peak = next(s.peak for s in fitting if s.change == "train.recompute=full")
    assert full_peak == replanned.worst.peak


def test_checkpoint_host_memory_follows_the_optimizer_format():
    """fully_reshardable gathers 12 bytes per parameter of each rank's TP x PP share on every
    rank; dp_reshardable (the default) holds only what the rank writes. Llama-3-70B at TP4 x
    PP4 (x CP2 x DP2): about 4.4B parameters per rank, so ~53 GB per rank, ~420 GB per node."""
    h100 = load_cluster(CLUSTER_DIR / "h100_80gb_8x8.yaml")
    cfg = get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2")
    assert cfg.checkpoint.optimizer_format == "dp_reshardable"
    cfg.checkpoint.optimizer_format = "fully_reshardable"
    full = make_plan(cfg, h100)
    stage = max(full.stages, key=lambda s: s.save_host)
    params, dp = stage.params.total, cfg.layout.data_parallel * cfg.layout.context
    assert stage.save_host == 12 * params + 2 * params / dp  # bf16 weights split over DP x CP
    assert 50e9 < stage.save_host < 60e9 and 400e9 < full.save_host_per_node < 480e9
    cfg.checkpoint.optimizer_format = "dp_reshardable"
    own = max(s.save_host for s in make_plan(cfg, h100).stages)
    assert own == pytest.approx(stage.save_host * (12 + 2) / (12 * dp + 2))


def test_a_save_that_cannot_fit_host_memory_is_refused_with_the_fix(tmp_path: Path):
    small = tmp_path / "small_host.yaml"
    small.write_text((CLUSTER_DIR / "h100_80gb_8x8.yaml").read_text().replace(
        "host_memory_gb: 2048", "host_memory_gb: 256"))
    cfg = get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2")
    check_fits(cfg, load_cluster(small))  # dp_reshardable: ~127 GB per node fits 256
    cfg.checkpoint.optimizer_format = "fully_reshardable"
    with pytest.raises(ConfigError) as caught:
        check_fits(cfg, load_cluster(small))
    message = str(caught.value)
    assert message.startswith("a checkpoint save holds 454.17 GB of CPU memory per node (fully_"
                              "reshardable gathers the whole fp32 optimizer state")
    assert message.endswith("but a node has 256 GB (host_memory_gb, h100_80gb_8x8); set "
                            "checkpoint.optimizer_format=dp_reshardable (no gather; a resume "
                            "may then change DP only), or raise TP x PP")
    cfg.checkpoint.save = False
    check_fits(cfg, load_cluster(small))  # a run that never saves is not refused for it


def test_cpu_ranks_are_planned_against_this_machines_memory_per_rank():
    from recipes.plan.fit import cpu_rank_cluster

    cfg = get_recipe("tiny_tp2_pp2")  # 4 ranks on one node
    cluster, memory_of = cpu_rank_cluster(cfg, host_bytes=24 * 10**9)
    plan = check_fits(cfg, cluster, attention="explicit", memory_of=memory_of)
    line = summary_line(plan, memory_of)
    assert "of 6.00 GB (this machine's memory per CPU rank: 24.0 GB / 4), fits" in line
    assert "85.9" not in line  # not an H100's memory
    with pytest.raises(ConfigError) as error:  # too little memory is a refusal naming it
        check_fits(cfg, cpu_rank_cluster(cfg, 10**6)[0], memory_of="this machine's memory")
    assert "but a rank has 0.25 MB (this machine's memory)" in str(error.value)


def test_host_memory_is_the_lower_of_ram_and_the_cgroup_limit(tmp_path):
    from recipes.config.machine import host_memory_bytes

    physical = host_memory_bytes(tmp_path / "absent")
    assert physical > 10**8
    (tmp_path / "memory.max").write_text("max\n")
    assert host_memory_bytes(tmp_path / "memory.max") == physical
    (tmp_path / "memory.max").write_text("1000000\n")
    assert host_memory_bytes(tmp_path / "memory.max") == 10**6


@pytest.mark.parametrize(("size", "text"), [
    (86_630, "86.63 kB"), (866_300, "0.87 MB"), (3.41e6, "3.41 MB"), (12.55e9, "12.55 GB"),
    (454.2e9, "454.20 GB"), (1283.6e9, "1.28 TB"), (3.2e15, "3.20 PB"), (6.4e25, "6.4e+16 GB"),
    (2**64, "1.8e+10 GB"),
])
def test_sizes_read_in_a_unit_a_person_can_compare(size, text):
    from recipes.plan.fit import size_text

    assert size_text(size) == text


def _tiny_on_cpu(seq_length: int, recipe: str = "tiny_dp1"):
    """The recipe at `seq_length` on one CPU rank of a 24 GB machine, and what its fit says."""
    from recipes.plan.fit import cpu_rank_cluster

    cfg = copy.deepcopy(get_recipe(recipe))
    cfg.model.seq_length = seq_length
    cluster, memory_of = cpu_rank_cluster(cfg, host_bytes=24 * 10**9)
    with pytest.raises(ConfigError) as error:
        check_fits(cfg, cluster, attention="explicit", memory_of=memory_of)
    return cfg, cluster, str(error.value)


def _longest_in(line: str) -> int:
    return int(re.search(r"at this layout model.seq_length=(\d+) fits at most", line)[1])


def _fits_at(cfg, cluster, seq_length: int) -> bool:
    from recipes.config.validation import validate
    from recipes.plan.build import PlanOptions

    cfg.model.seq_length = seq_length
    validate(cfg)  # a length the layout can split
    return make_plan(cfg, cluster, PlanOptions(listed_groups=0, attention="explicit")).fits


def test_a_sequence_no_machine_holds_is_named_with_the_longest_that_fits_this_layout():
    """seq_length=1e12: no single change fits, so the line leads with the field, says no machine
    can hold it, and gives the longest sequence that fits at this layout: planned again, it
    fits, and one token longer does not."""
    cfg, cluster, line = _tiny_on_cpu(10**12)
    assert "\n" not in line
    assert line.startswith(
        "model.seq_length=1000000000000 needs 1.3e+17 GB on a rank of pipeline stage 0 but a "
        "rank has 24.00 GB (this machine's memory per CPU rank: 24.0 GB / 1), and no machine can "
        "hold it (a 64-bit process addresses at most 1.8e+10 GB); largest: activations ")
    assert line.endswith("fits at most, or split each sequence over more ranks "
                         "(parallel.context, or parallel.tensor with "
                         "parallel.sequence_parallel=true) (scripts/plan.py shows the whole plan)")
    longest = _longest_in(line)
    assert _fits_at(cfg, cluster, longest) and not _fits_at(cfg, cluster, longest + 1)


def test_the_longest_fitting_sequence_is_one_the_layout_can_split():
    """At CP2 x TP2 with sequence parallel a sequence is a multiple of 2 x CP x TP = 8 (each CP
    chunk split over TP): the longest that fits is the last such multiple; a 1.60 PB need is
    too much for this machine, not for every machine."""
    cfg, cluster, line = _tiny_on_cpu(10**7, "tiny_cp2_tp2_sp")
    assert line.startswith("model.seq_length=10000000 needs 1.60 PB on a rank of pipeline stage")
    assert "no machine" not in line
    longest = _longest_in(line)
    assert longest % 8 == 0
    assert _fits_at(cfg, cluster, longest) and not _fits_at(cfg, cluster, longest + 8)


def test_numbers_and_times_read_as_written(tmp_path: Path):
    """`1e30` is a number (PyYAML alone reads it as text) and an unquoted `4:00:00` a time
    limit (PyYAML alone: 14,400, base 60)."""
    text = (CLUSTER_DIR / "h100_80gb_8x8.yaml").read_text().replace(
        "gpu_memory_gb: 80", "gpu_memory_gb: 8e1\ntime: 4:00:00")
    good = tmp_path / "good.yaml"
    good.write_text(text)
    spec = load_cluster(good)
    assert (spec.gpu_memory_gb, spec.time) == (80.0, "4:00:00")


def test_a_cluster_file_that_is_not_utf8_is_one_line(tmp_path: Path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes((CLUSTER_DIR / "h100_80gb_8x8.yaml").read_bytes() + b"account: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.yaml is not UTF-8 text \(byte \d+\); save it"):
        load_cluster(bad)


def test_a_cluster_file_that_is_a_folder_or_missing_is_named_so(tmp_path: Path):
    with pytest.raises(ConfigError, match=rf"^cluster={tmp_path} is a folder, not a file; use "
                                          r"one of conf/cluster/\{"):
        load_cluster(tmp_path)
    with pytest.raises(ConfigError, match=r"nope.yaml does not exist; use one of conf/cluster/"):
        load_cluster(tmp_path / "nope.yaml")


EIGHT_B_ON_ONE_NODE = ["recipe=llama3_8b_tp8_dp8", "cluster.nodes=1", "parallel.tensor=1",
                       "parallel.sequence_parallel=false", "precision.grad_reduce_in_fp32=false",
                       "train.global_batch_size=16"]


def _eight_b(*more: str):
    from recipes.resolve import resolve_config

    cluster = load_cluster(CLUSTER_DIR / "h100_80gb_8x8.yaml")
    return apply_cluster(resolve_config([*EIGHT_B_ON_ONE_NODE, *more]), cluster), cluster


def _words(change: str) -> list[str]:
    """A suggestion's overrides, without its words in brackets."""
    return [w for w in change.split(" (")[0].split() if "=" in w]


@pytest.mark.parametrize("more", [
    ["optimizer.distributed=true", "optimizer.cpu_offload=true"]])
def test_sharding_suggestions_name_every_field_and_train_as_priced(more):
    """From offload the ZeRO-3 suggestion says optimizer.cpu_offload=false: applied as written,
    it validates and plans to its price. (From ZeRO-3, offload raises the peak and is not
    suggested: tests/unit/test_plan_what_if_rules.py.)"""
    from recipes.config.validation import validate

    cfg, cluster = _eight_b(*more)
    plan = make_plan(cfg, cluster, PlanOptions(listed_groups=0))
    changes = [s for s in suggestions(plan) if "optimizer." in s.change]
    assert changes
    for s in changes:
        applied, _ = _eight_b(*more, *_words(s.change))
        validate(applied)
        assert make_plan(applied, cluster, PlanOptions(listed_groups=0)).worst.peak == s.peak


def test_suggestions_under_the_planners_what_ifs_price_the_change():
    """With sharding=dist_opt offload=true asked, the ZeRO-3 suggestion is priced as ZeRO-3
    (without offload, which Megatron FSDP excludes), not as the what-if it replaces."""
    cfg, cluster = _eight_b()
    plan = make_plan(cfg, cluster, PlanOptions(listed_groups=0, sharding="dist_opt", offload=True))
    [zero3] = [s for s in suggestions(plan) if "optim_grads_params" in s.change]
    as_zero3, _ = _eight_b("optimizer.distributed=true", "optimizer.fsdp=optim_grads_params")
    assert zero3.peak == make_plan(as_zero3, cluster, PlanOptions(listed_groups=0)).worst.peak
    assert zero3.peak != plan.worst.peak


@pytest.mark.parametrize(("options", "expected"), [
    (dict(sharding="optim_grads", offload=True), "sharding=optim_grads offload=true plans a run "
     "Megatron refuses: optimizer.cpu_offload=true with optimizer.fsdp=optim_grads"),
    (dict(sharding="none", offload=True), "sharding=none offload=true plans a run Megatron "
     "refuses: optimizer.cpu_offload=true runs Megatron's hybrid-device optimizer inside"),
    (dict(offload=True), None),
    (dict(sharding="optim_grads_params"), None),
])
def test_planner_what_ifs_megatron_refuses_are_one_line(options, expected):
    from recipes.plan.fit import what_if_problem

    cfg, _ = _eight_b()
    problem = what_if_problem(cfg, PlanOptions(**options))
    assert problem == expected if expected is None else problem.startswith(expected)


def test_offload_of_fp32_weights_is_a_what_if_megatron_refuses():
    from recipes.plan.fit import what_if_problem

    cfg, _ = _eight_b("precision.dtype=fp32")
    assert what_if_problem(cfg, PlanOptions(offload=True)).startswith(
        "offload=true plans a run Megatron refuses: optimizer.cpu_offload=true with "
        "precision.dtype=fp32")

"""Megatron FSDP as a recipe field: through the one translation, in the planner's memory and
the step model's DP communication, enumerated by the search where the distributed optimizer
alone does not fit, written and read as Megatron-LM flags (offload's too)."""

from __future__ import annotations

import dataclasses

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.megatron_args import to_megatron_args
from recipes.plan.build import PlanOptions, stage_plans
from recipes.plan.cluster import load_cluster
from recipes.plan.params import stage_params
from recipes.plan.search import apply_candidate, candidate_of, search
from recipes.plan.steptime import step_time
from recipes.resolve import resolve_config

H100 = "conf/cluster/h100_80gb_8x8.yaml"


def _cfg(*overrides):
    return resolve_config(["recipe=llama3_8b_tp8_dp8", f"cluster.spec={H100}", *overrides])


def _plan(cfg):
    cluster = load_cluster(H100)
    stages = stage_plans(cfg, cluster, PlanOptions(listed_groups=0))
    return stages, step_time(cfg, stages, cluster.peak_tflops[cfg.precision.dtype])


def test_translation_sets_megatrons_fsdp_fields():
    from trainer.mcore_translation import build_ddp_config

    ddp = build_ddp_config(_cfg("optimizer.distributed=true", "optimizer.fsdp=optim_grads_params"))
    assert ddp.use_megatron_fsdp and ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert not build_ddp_config(_cfg()).use_megatron_fsdp


def test_sharding_weights_lowers_memory_and_costs_dp_communication():
    base = _cfg("optimizer.distributed=true", "optimizer.overlap_grad_reduce=true",
                "optimizer.overlap_param_gather=true", "parallel.tensor=1",
                "parallel.sequence_parallel=false",
                "train.micro_batch_size=1")
    peaks, dps = [], []
    for fsdp in ("none", "optim_grads", "optim_grads_params"):
        stages, time = _plan(dataclasses.replace(
            base, optimizer=dataclasses.replace(base.optimizer, fsdp=fsdp)))
        peaks.append(max(s.peak for s in stages))
        dps.append(time.dp)
    assert peaks[0] > peaks[1] > peaks[2]
    assert dps[0] <= dps[1] <= dps[2] and dps[2] > dps[0]


def test_search_enumerates_fsdp_where_the_distributed_optimizer_does_not_fit():
    cfg = _cfg("cluster.nodes=1")  # 8B on 8 GPUs of 40 GB: the model state is tight
    small = dataclasses.replace(load_cluster(H100), gpu_memory_gb=40.0)
    result = search(cfg, small, top=50)
    kinds = {e.candidate.fsdp for e in result.fitting}
    assert "optim_grads_params" in kinds
    best = result.listed[0].candidate
    assert apply_candidate(cfg, best).optimizer.fsdp == best.fsdp
    assert candidate_of(apply_candidate(cfg, best)) == best


def test_megatron_lm_flags_round_trip_every_level_and_offload():
    cfg = _cfg("optimizer.distributed=true", "optimizer.fsdp=optim_grads")
    args = to_megatron_args(cfg)
    assert "--use-megatron-fsdp" in args and "fsdp_dtensor" in args
    from recipes.config.megatron_args import SPELLED

    fsdp = next(s for s in SPELLED if s.fields == ("optimizer.fsdp",))
    for level in ("optim", "optim_grads", "optim_grads_params"):
        assert fsdp.from_args({"use_megatron_fsdp": True, "ckpt_format": "fsdp_dtensor",
                               "data_parallel_sharding_strategy": level}) == {
            "optimizer.fsdp": level}
    with pytest.raises(ConfigError, match="--data-parallel-sharding-strategy no_shard "):
        fsdp.from_args({"use_megatron_fsdp": True, "ckpt_format": "fsdp_dtensor",
                        "data_parallel_sharding_strategy": "no_shard"})
    with pytest.raises(ConfigError, match="--ckpt-format torch_dist with --use-megatron-fsdp"):
        fsdp.from_args({"use_megatron_fsdp": True, "ckpt_format": "torch_dist",
                        "data_parallel_sharding_strategy": "optim"})
    offload = next(s for s in SPELLED if "optimizer.cpu_offload" in s.fields)
    on = _cfg("optimizer.distributed=true", "precision.dtype=bf16", "optimizer.cpu_offload=true",
              "optimizer.offload_fraction=0.5")
    assert offload.to_args(on) == ["--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                                   "--optimizer-offload-fraction", "0.5"]
    assert offload.from_args({"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5,
                              "use_precision_aware_optimizer": True}) == {
        "optimizer.cpu_offload": True, "optimizer.offload_fraction": 0.5}
    with pytest.raises(ConfigError, match="--use-precision-aware-optimizer without"):
        offload.from_args({"optimizer_cpu_offload": False, "optimizer_offload_fraction": 1.0,
                           "use_precision_aware_optimizer": True})
    # through Megatron-LM's own parser, as plan.py megatron_args= reads a command line
    from trainer.tools.megatron_args import config_from_megatron_args

    for level in ("optim", "optim_grads", "optim_grads_params"):
        sharded = _cfg("optimizer.distributed=true", f"optimizer.fsdp={level}")
        back, _ = config_from_megatron_args(to_megatron_args(sharded), sharded.cluster)
        assert back.optimizer.fsdp == level
    back, _ = config_from_megatron_args(to_megatron_args(on), on.cluster)
    assert (back.optimizer.cpu_offload, back.optimizer.offload_fraction) == (True, 0.5)


def test_eight_b_on_eight_gpus_by_level_through_the_planner():
    """The memory chapter's table, from the Llama 3 8B recipe on one node of 8 H100s (BF16
    weights and gradients, FP32 master and moments: 16 bytes a parameter): ZeRO-1 44 GB,
    ZeRO-2 30 GB, ZeRO-3 16 GB of model state per GPU."""
    cfg = _cfg("cluster.nodes=1", "parallel.tensor=1", "parallel.sequence_parallel=false",
               "precision.grad_reduce_in_fp32=false", "train.global_batch_size=16")
    params = stage_params(cfg)[0].total
    cluster = load_cluster(H100)
    per_gpu = {}
    for level in ("dist_opt", "optim", "optim_grads", "optim_grads_params"):
        stages = stage_plans(cfg, cluster, PlanOptions(sharding=level, listed_groups=0))
        per_gpu[level] = stages[0].state.total
    assert per_gpu["dist_opt"] == per_gpu["optim"] == params * (2 + 2 + 12 / 8)
    assert per_gpu["optim_grads"] == params * (2 + (2 + 12) / 8)
    assert per_gpu["optim_grads_params"] == params * 16 / 8
    assert {k: round(v / 1e9) for k, v in per_gpu.items()} == {
        "dist_opt": 44, "optim": 44, "optim_grads": 30, "optim_grads_params": 16}


def test_search_offers_offload_where_nothing_on_the_gpu_fits():
    """8B on one 80 GB GPU: no GPU-resident sharding fits (ZeRO-3 at DP1 shards nothing); with
    the optimizer state in CPU memory it does. On two GPUs ZeRO-3 fits and offload is not
    what the search lists first."""
    one = _cfg("cluster.nodes=1", "cluster.gpus_per_node=1", "parallel.tensor=1",
               "parallel.sequence_parallel=false", "train.global_batch_size=16")
    result = search(one, load_cluster(H100), top=5)
    assert result.listed and all(e.candidate.offload for e in result.listed)
    from recipes.plan.search_report import text_search

    assert "its modeled step leaves out the CPU's Adam step" in text_search(
        one, load_cluster(H100), result)
    applied = apply_candidate(one, result.listed[0].candidate)
    assert applied.optimizer.cpu_offload and applied.optimizer.distributed
    two = _cfg("cluster.nodes=1", "cluster.gpus_per_node=2", "parallel.tensor=1",
               "parallel.sequence_parallel=false", "train.global_batch_size=16")
    best = search(two, load_cluster(H100), top=5).listed[0].candidate
    assert best.fsdp == "optim_grads_params" and not best.offload


def test_the_save_line_names_the_format_the_sharding_saves() -> None:
    """`sharding=` asks about Megatron FSDP for a recipe that does not use it: the save line
    then names fsdp_dtensor (what such a run saves), not the recipe's optimizer_format."""
    from recipes.plan.build import make_plan
    from recipes.plan.report import text_report

    cfg = resolve_config(["recipe=llama3_8b_tp8_dp8"])
    cluster = load_cluster("conf/cluster/h100_80gb_8x8.yaml")
    for sharding, saved in (("optim_grads_params", "Megatron FSDP's fsdp_dtensor"),
                            ("optim", "Megatron FSDP's fsdp_dtensor"),
                            ("dist_opt", "checkpoint.optimizer_format=")):
        report = text_report(make_plan(cfg, cluster, PlanOptions(sharding=sharding)))
        assert f"CPU memory per rank ({saved}" in report, sharding

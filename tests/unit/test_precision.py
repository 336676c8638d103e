"""Precision presets on CPU: each maps onto exactly the Megatron fields it should, and every
refusal (config rule or machine need) fires alone with its one line.

Presets are `precision.dtype` (bf16, fp16 with its loss scaling) plus, for FP8, the
`plugins.fp8` plugin. Machines without CUDA or Transformer Engine, or with too low a compute
capability, are described by `MachineInfo`, not needed for real. The fp16 loss scaler itself
(skips, counting, resume) runs in tests/dist/test_fp16.py.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from plugins.fp8 import config as fp8_config
from plugins.fp8.config import Fp8Config
from plugins.protocol.errors import ConfigError
from plugins.registry import build_plugins
from recipes.config.machine import (
    MachineInfo,
    check_machine,
    parse_compute_capabilities,
    ranks_on_cpu,
)
from recipes.config.overrides import apply_overrides
from recipes.config.schema import PrecisionConfig
from recipes.config.validation import all_rules
from recipes.registry import get_recipe
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
BF16, FP8 = ["precision.dtype=bf16"], ["precision.dtype=bf16", "plugins.fp8.format=hybrid"]
NVFP4 = ["precision.dtype=bf16", "plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4"]
HOPPER = MachineInfo(gpus=8, launched_world_size=None, compute_capability=(9, 0),
                     transformer_engine="2.8.0")

# preset -> (overrides of tiny_dp1, TransformerConfig fields, OptimizerConfig fields)
PRESETS = {
    "bf16": (BF16, {"bf16": True, "fp16": False, "params_dtype": torch.bfloat16,
                    "pipeline_dtype": torch.bfloat16, "fp8": None},
             {"bf16": True, "fp16": False, "params_dtype": torch.bfloat16, "loss_scale": None}),
    "fp16": (["precision.dtype=fp16", "precision.initial_loss_scale=65536",
              "precision.min_loss_scale=2", "precision.loss_scale_window=200",
              "precision.hysteresis=1"],
             {"bf16": False, "fp16": True, "params_dtype": torch.float16, "fp8": None},
             {"bf16": False, "fp16": True, "params_dtype": torch.float16, "loss_scale": None,
              "initial_loss_scale": 65536.0, "min_loss_scale": 2.0, "loss_scale_window": 200,
              "hysteresis": 1}),
    "fp16_static": (["precision.dtype=fp16", "precision.loss_scale=1024"], {"fp16": True},
                    {"fp16": True, "loss_scale": 1024.0}),
    "fp8_delayed": ([*FP8, "plugins.fp8.recipe=delayed", "plugins.fp8.amax_history_len=16",
                     "plugins.fp8.amax_compute_algo=most_recent", "plugins.fp8.margin=1"],
                    {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed",
                     "fp8_amax_history_len": 16, "fp8_amax_compute_algo": "most_recent",
                     "fp8_margin": 1, "first_last_layers_bf16": False},
                    {"bf16": True, "loss_scale": None}),
    "fp8_current": ([*FP8, "plugins.fp8.recipe=tensorwise", "plugins.fp8.first_layers_bf16=1",
                     "plugins.fp8.last_layers_bf16=2"],
                    {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
                     "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 2},
                    {"bf16": True}),
    "fp8_blockwise": ([*BF16, "plugins.fp8.format=e4m3", "plugins.fp8.recipe=blockwise"],
                      {"fp8": "e4m3", "fp8_recipe": "blockwise", "first_last_layers_bf16": False},
                      {"bf16": True}),
    # FP8 parameters, as Megatron-LM's --fp8-param-gather sets them (argument_utils.py:312).
    "fp8_param_gather": ([*FP8, "plugins.fp8.recipe=tensorwise", "plugins.fp8.param_gather=true",
                          "optimizer.distributed=true"],
                         {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": True},
                         {"bf16": True, "fp8_recipe": "tensorwise",
                          "use_distributed_optimizer": True}),
    # NVFP4 as Nemotron 3 Super's preset: Megatron's fp4 fields, no fp8 ones (fp4_utils.py).
    "nvfp4": ([*NVFP4, "plugins.fp8.last_layers_bf16=1"],
              {"fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8": None, "fp4_param": False,
               "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 0,
               "num_layers_at_end_in_bf16": 1},
              {"bf16": True, "fp8_recipe": None}),
    "nvfp4_param_gather": ([*NVFP4, "plugins.fp8.param_gather=true", "optimizer.distributed=true"],
                           {"fp4": "e2m1", "fp4_param": True, "fp8": None,
                            "first_last_layers_bf16": False},
                           {"bf16": True, "fp8_recipe": None, "use_distributed_optimizer": True}),
    "mxfp8": ([*FP8, "plugins.fp8.recipe=mxfp8", "plugins.fp8.last_layers_bf16=1"],
              {"fp8": "hybrid", "fp8_recipe": "mxfp8", "first_last_layers_bf16": True,
               "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 1},
              {"bf16": True}),
}


def rules_of(cfg) -> list:
    """Every rule `cfg` meets: core, precision section's, plugins' (once, if already wired)."""
    return list(dict.fromkeys((*all_rules(cfg), *cfg.precision.rules())))


def failing(cfg) -> list[str]:
    return [rule.__name__ for rule in rules_of(cfg) if rule(cfg)]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_maps_onto_exactly_these_megatron_fields(preset) -> None:
    from trainer.mcore_translation import (
        build_ddp_config,
        build_optimizer_config,
        build_transformer_config,
    )

    overrides, transformer, optimizer = PRESETS[preset]
    cfg = apply_overrides(get_recipe("tiny_dp1"), overrides)
    assert failing(cfg) == []
    # The plugins' hook replaces fields, so TransformerConfig's own checks run with them on.
    config = build_plugins(cfg).transformer_config(
        build_transformer_config(cfg, cpu_initialization=True)
    )
    assert {key: getattr(config, key) for key in transformer} == transformer
    built = build_optimizer_config(cfg)
    assert {key: getattr(built, key) for key in optimizer} == optimizer
    gather, fp4 = cfg.plugins.fp8.param_gather, cfg.plugins.fp8.fp4
    # The optimizer reads the recipe only to shard FP8 parameters (distrib_optimizer.py:403-409).
    assert (built.fp8_recipe is not None) == (gather and not fp4)
    ddp = build_ddp_config(cfg)
    assert ddp.grad_reduce_in_fp32 and ddp.fp8_param_gather == (gather and not fp4)
    assert ddp.fp4_param_gather == (gather and fp4)


def test_fp8_off_builds_no_plugin_and_sets_nothing() -> None:
    cfg = get_recipe("tiny_dp1")
    assert not Fp8Config().active(cfg) and Fp8Config().transformer_fields() == {}
    assert "fp8" not in [p.name for p in build_plugins(cfg)]


def test_fp8_fields_come_from_the_plugin_config() -> None:
    fields = Fp8Config(format="e4m3", recipe="tensorwise", first_layers_bf16=2).transformer_fields()
    assert fields == {
        "fp8": "e4m3", "fp8_recipe": "tensorwise", "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max", "fp8_margin": 0, "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 0, "fp8_param": False,
    }
    assert Fp8Config(format="e4m3").build().fields["fp8"] == "e4m3"


# ---- config rules: (rule, overrides of tiny_dp1, text of its one line) ------------------------

RULE_CASES = [
    ("check_loss_scale_positive", ["precision.dtype=fp16", "precision.hysteresis=0"],
     "precision.hysteresis=0 must be positive; set it, e.g. precision.hysteresis=2"),
    ("check_loss_scale_positive", ["precision.dtype=fp16", "precision.loss_scale=-8"],
     "precision.loss_scale=-8 must be positive; set it, e.g. precision.loss_scale=65536"),
    ("check_min_loss_scale", ["precision.dtype=fp16", "precision.initial_loss_scale=4",
                              "precision.min_loss_scale=8"],
     "precision.min_loss_scale=8 is above precision.initial_loss_scale=4; lower the minimum"),
    ("check_loss_scale_needs_fp16", ["precision.dtype=bf16", "precision.loss_scale=128"],
     "precision.loss_scale=128 only applies to fp16 training, but precision.dtype=bf16; set "
     "precision.dtype=fp16"),
    ("check_fp8_settings_unused", ["plugins.fp8.recipe=tensorwise"],
     "plugins.fp8.recipe=tensorwise has no effect while plugins.fp8.format=null; turn FP8 on "
     "with plugins.fp8.format=hybrid"),
    ("check_fp8_delayed_settings", [*FP8, "plugins.fp8.recipe=mxfp8", "plugins.fp8.margin=2"],
     "plugins.fp8.margin=2 is read only by delayed scaling, but plugins.fp8.recipe=mxfp8"),
    ("check_fp8_scaling_values", [*FP8, "plugins.fp8.amax_history_len=0"],
     "plugins.fp8.amax_history_len=0 must be at least 1"),
    ("check_fp8_scaling_values", [*FP8, "plugins.fp8.margin=-1"],
     "plugins.fp8.margin=-1 must not be negative"),
    ("check_fp8_bf16_layers_recipe", [*FP8, "plugins.fp8.first_layers_bf16=1"],
     "plugins.fp8.first_layers_bf16=1 cannot be used with plugins.fp8.recipe=delayed"),
    ("check_fp8_bf16_layers_range", ["recipe=tiny_pp2", *FP8, "plugins.fp8.recipe=tensorwise",
                                     "plugins.fp8.last_layers_bf16=3"],
     "plugins.fp8.last_layers_bf16=3 exceeds the 2 layers of one pipeline stage "
     "(model.num_layers=4 / parallel.pipeline=2)"),
    ("check_fp8_bf16_layers_leave_fp8", [*FP8, "plugins.fp8.recipe=tensorwise",
                                         "plugins.fp8.first_layers_bf16=2",
                                         "plugins.fp8.last_layers_bf16=2"],
     "keep all 4 layers in bf16, so nothing trains in FP8"),
    ("check_fp8_param_gather_distributed", [*FP8, "plugins.fp8.param_gather=true"],
     "plugins.fp8.param_gather=true keeps the weights in FP8 and refreshes them from the "
     "distributed optimizer's fp32 shards, but optimizer.distributed=false; set "
     "optimizer.distributed=true or plugins.fp8.param_gather=false"),
    ("check_fp8_param_gather_master", ["precision.dtype=fp32", "plugins.fp8.format=hybrid",
                                       "plugins.fp8.param_gather=true",
                                       "optimizer.distributed=true"],
     "plugins.fp8.param_gather=true with precision.dtype=fp32: FP8 weights are refreshed from "
     "the fp32 master copy Megatron's optimizer keeps for bf16/fp16 weights only (fp32 weights "
     "are stepped in place); set precision.dtype=bf16 or plugins.fp8.param_gather=false"),
    ("check_fp8_delayed_recompute_modules", [*FP8, "train.recompute=selective",
                                             "train.recompute_modules=[core_attn,layernorm]"],
     "train.recompute_modules has layernorm, which Megatron cannot recompute with "
     "plugins.fp8.recipe=delayed"),
    ("check_fp8_param_gather_offload", ["recipe=tiny_dp2_bf16_offload", *FP8,
                                        "plugins.fp8.recipe=tensorwise",
                                        "plugins.fp8.param_gather=true"],
     "Megatron offloads FP8 parameters with delayed scaling only"),
    ("check_fp8_needs_te_layers", [*FP8, "model.transformer_impl=local"],
     "plugins.fp8.format=hybrid runs in Transformer Engine's layers, but "
     "model.transformer_impl=local builds Megatron's own, which never use FP8"),
    ("check_fp8_settings_unused", ["plugins.fp8.param_gather=true"],
     "plugins.fp8.param_gather=True has no effect while plugins.fp8.format=null"),
    ("check_fp8_shapes", [*FP8, "model.ffn_hidden_size=200"],
     "plugins.fp8.format=hybrid needs model.ffn_hidden_size divisible by 16, got 200"),
    ("check_fp8_shapes", ["recipe=tiny_tp2", *FP8, "model.ffn_hidden_size=272"],
     "needs model.ffn_hidden_size / parallel.tensor (the MLP width on one TP rank) divisible "
     "by 16, got 136"),
    ("check_fp8_shapes", [*FP8, "plugins.fp8.recipe=mxfp8", "model.hidden_size=48",
                          "model.num_attention_heads=3"],
     "plugins.fp8.recipe=mxfp8 needs model.hidden_size divisible by 32, got 48"),
    ("check_fp8_shapes", [*NVFP4, "model.ffn_hidden_size=272"],
     "plugins.fp8.recipe=nvfp4 needs model.ffn_hidden_size divisible by 32, got 272"),
    ("check_fp8_shapes", ["recipe=super_tiny_dp1", *NVFP4, "model.moe_latent_size=48"],
     "plugins.fp8.recipe=nvfp4 needs model.moe_latent_size divisible by 32, got 48"),
    ("check_fp4_format_and_recipe", [*BF16, "plugins.fp8.format=e2m1"],
     "plugins.fp8.format=e2m1 (NVFP4) is scaled by plugins.fp8.recipe=nvfp4, not delayed; set "
     "plugins.fp8.recipe=nvfp4"),
    ("check_fp4_format_and_recipe", [*FP8, "plugins.fp8.recipe=nvfp4"],
     "plugins.fp8.recipe=nvfp4 scales 4-bit E2M1 values, but plugins.fp8.format=hybrid"),
]


def _recipe_and_overrides(overrides: list[str]):
    recipe = next((o.split("=")[1] for o in overrides if o.startswith("recipe=")), "tiny_dp1")
    return get_recipe(recipe), [o for o in overrides if not o.startswith("recipe=")]


@pytest.mark.parametrize(("rule", "overrides", "message"), RULE_CASES,
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in RULE_CASES])
def test_rule_fires_alone_with_its_line(rule, overrides, message) -> None:
    cfg = apply_overrides(*_recipe_and_overrides(overrides))
    assert failing(cfg) == [rule]
    line = next(r(cfg) for r in rules_of(cfg) if r.__name__ == rule)
    assert message in line and "\n" not in line


def test_every_precision_rule_has_a_case() -> None:
    cfg = get_recipe("tiny_dp1")
    own = {r.__name__ for r in (*PrecisionConfig().rules(), *cfg.plugins.fp8.rules())}
    assert own == {case[0] for case in RULE_CASES}


def test_fp8_rules_run_in_validation() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), [*FP8, "plugins.fp8.first_layers_bf16=1"])
    from recipes.config.validation import validate

    with pytest.raises(ConfigError, match="cannot be used with plugins.fp8.recipe=delayed"):
        validate(cfg)


def test_precision_rules_run_in_validation() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=fp16",
                                                  "precision.hysteresis=0"])
    # A rule dropped from validation must fail here, not skip: a skip would hide it for good.
    missing = set(PrecisionConfig().rules()) - set(all_rules(cfg))
    assert not missing, f"validation's all_rules does not run {sorted(r.__name__ for r in missing)}"
    from recipes.config.validation import validate

    with pytest.raises(ConfigError, match="precision.hysteresis=0 must be positive"):
        validate(cfg)


# ---- machine needs: each check alone on a machine lacking only that --------------------------

MACHINE_CASES = [
    ("fp8_needs_cuda", FP8, MachineInfo(gpus=0, launched_world_size=None,
                                         transformer_engine="2.8.0"),
     "plugins.fp8.format=hybrid needs CUDA GPUs (Transformer Engine's FP8 GEMMs), but this run "
     "would train on the CPU runtime (found 0 GPUs); run on a GPU node or set "
     "plugins.fp8.format=null"),
    ("fp8_needs_cuda", [*FP8, "cluster.device=cpu"], HOPPER,
     "would train on the CPU runtime (found 8 GPUs)"),
    ("fp8_needs_transformer_engine", FP8,
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(9, 0)),
     "plugins.fp8.format=hybrid needs Transformer Engine, which is not installed here"),
    ("fp8_transformer_engine_version", [*FP8, "plugins.fp8.recipe=blockwise"],
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(9, 0),
                 transformer_engine="2.2.0"),
     "plugins.fp8.recipe=blockwise needs Transformer Engine >= 2.3.0.dev0 (Megatron refuses it "
     "otherwise), found 2.2.0"),
    ("fp8_param_gather_transformer_engine",
     [*FP8, "plugins.fp8.recipe=tensorwise", "plugins.fp8.param_gather=true",
      "optimizer.distributed=true"],
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(9, 0),
                 transformer_engine="2.2.0.dev0"),
     "plugins.fp8.param_gather=true with plugins.fp8.recipe=tensorwise needs Transformer Engine "
     ">= 2.2 (Megatron writes the optimizer's fp32 weights into tensorwise FP8 parameters only "
     "from there on), found 2.2.0.dev0; upgrade Transformer Engine or set "
     "plugins.fp8.param_gather=false"),
    ("fp8_compute_capability", FP8,
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(8, 0),
                 transformer_engine="2.8.0"),
     "plugins.fp8.recipe=delayed needs GPU compute capability 8.9 or higher, this GPU has 8.0; "
     "use plugins.fp8.format=null (bf16 alone)"),
    ("fp8_compute_capability", [*FP8, "plugins.fp8.recipe=tensorwise"],
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(8, 6),
                 transformer_engine="2.8.0"),
     "plugins.fp8.recipe=tensorwise needs GPU compute capability 8.9 or higher"),
    ("fp8_compute_capability", [*FP8, "plugins.fp8.recipe=mxfp8"], HOPPER,
     "plugins.fp8.recipe=mxfp8 needs GPU compute capability 10.0 or higher, this GPU has 9.0; "
     "use plugins.fp8.recipe=tensorwise"),
    # NVFP4 on Hopper and on CPU ranks: refused before launch, one line each.
    ("fp8_compute_capability", NVFP4, HOPPER,
     "plugins.fp8.recipe=nvfp4 needs GPU compute capability 10.0 or higher, this GPU has 9.0 "
     "(NVFP4 GEMMs run on Blackwell: B200, GB200); use plugins.fp8.format=hybrid "
     "plugins.fp8.recipe=tensorwise (FP8) or plugins.fp8.format=null (bf16 alone)"),
    ("fp8_needs_cuda", NVFP4, MachineInfo(gpus=0, launched_world_size=None,
                                           transformer_engine="2.8.0"),
     "plugins.fp8.format=e2m1 needs CUDA GPUs (Transformer Engine's NVFP4 GEMMs, on Blackwell), "
     "but this run would train on the CPU runtime (found 0 GPUs)"),
    ("fp8_transformer_engine_version", NVFP4,
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(10, 0),
                 transformer_engine="2.6.0"),
     "plugins.fp8.recipe=nvfp4 needs Transformer Engine >= 2.7.0.dev0"),
    ("fp8_compute_capability", [*FP8, "plugins.fp8.recipe=blockwise"],
     MachineInfo(gpus=8, launched_world_size=None, compute_capability=(8, 9),
                 transformer_engine="2.8.0"),
     "plugins.fp8.recipe=blockwise needs GPU compute capability 9.0 or higher, this GPU has 8.9"),
]



def _te(version: str) -> MachineInfo:
    return MachineInfo(gpus=8, launched_world_size=None, compute_capability=(9, 0),
                       transformer_engine=version)


TENSORWISE = [*FP8, "plugins.fp8.recipe=tensorwise"]
RECOMPUTE = ["train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]"]
# Needs that depend on the rest of the run (experts, recomputed modules): the check, the recipe
# and its overrides, a TE it refuses and the floor it lets through (the plugin's constant).
RUN_MACHINE_CASES = [
    ("fp8_recompute_transformer_engine", "mixtral_tiny_ep1", [*TENSORWISE, *RECOMPUTE], "2.5.0",
     fp8_config.FP8_RECOMPUTE_MIN_TE,
     "train.recompute_modules has layernorm, which Megatron recomputes under "
     "plugins.fp8.format=hybrid only with Transformer Engine >= 2.6.0.dev0, found 2.5.0; "
     "upgrade Transformer Engine or remove layernorm"),
    ("fp8_recompute_transformer_engine", "mixtral_tiny_ep1",
     [*TENSORWISE, "model.moe_grouped_gemm=true", "train.recompute=selective",
      "train.recompute_modules=[moe_act]"], "2.2.0", fp8_config.FP8_RECOMPUTE_MIN_TE,
     "train.recompute_modules has moe_act, which Megatron recomputes under"),
    ("fp8_moe_transformer_engine", "mixtral_tiny_ep1", FP8, "1.6.0", fp8_config.FP8_MOE_MIN_TE,
     "model.num_moe_experts=4 with plugins.fp8.format=hybrid: FP8 on experts needs Transformer "
     "Engine >= 1.7.0.dev0, found 1.6.0; upgrade Transformer Engine or set "
     "plugins.fp8.format=null"),
    ("fp8_moe_transformer_engine", "mixtral_tiny_ep1", [*FP8, "model.moe_grouped_gemm=true"],
     "1.10.0", fp8_config.FP8_GROUPED_GEMM_MIN_TE,
     "FP8 in grouped GEMMs (model.moe_grouped_gemm=true) needs Transformer Engine >= 1.11.0, "
     "found 1.10.0; upgrade Transformer Engine or set plugins.fp8.format=null or "
     "model.moe_grouped_gemm=false"),
]


def test_run_machine_needs_pass_at_their_floor() -> None:
    for _, recipe, overrides, _, floor, _ in RUN_MACHINE_CASES:
        check_machine(apply_overrides(get_recipe(recipe), overrides), _te(floor))


@pytest.mark.parametrize(
    ("check", "recipe", "overrides", "machine", "message"),
    [*[(c, "tiny_dp1", *rest) for c, *rest in MACHINE_CASES],
     *[(c, recipe, overrides, _te(refused), message)
       for c, recipe, overrides, refused, _, message in RUN_MACHINE_CASES]],
    ids=[f"{c[0]}:{' '.join(c[1])}" for c in MACHINE_CASES]
    + [f"{c[0]}:{c[1]} {' '.join(c[2])}" for c in RUN_MACHINE_CASES])
def test_machine_need_fires_alone_before_launch(check, recipe, overrides, machine,
                                               message) -> None:
    cfg = apply_overrides(get_recipe(recipe), overrides)
    assert failing(cfg) == []
    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    fired = [c.__name__ for c in fp8_config.MACHINE_CHECKS if c(cfg, machine, on_cpu)]
    assert fired == [check]
    with pytest.raises(ConfigError) as caught:
        check_machine(cfg, machine)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("recipe", "capability"), [
    ("delayed", (8, 9)), ("tensorwise", (9, 0)), ("blockwise", (9, 0)), ("mxfp8", (10, 0)),
    ("nvfp4", (10, 0)),  # Blackwell
    ("tensorwise", None),  # nvidia-smi could not tell: Transformer Engine decides at run time
])
def test_machines_that_can_run_a_preset_pass(recipe, capability) -> None:
    fmt = "e2m1" if recipe == "nvfp4" else "hybrid"
    cfg = apply_overrides(get_recipe("tiny_dp1"), [*BF16, f"plugins.fp8.format={fmt}",
                                                   f"plugins.fp8.recipe={recipe}"])
    check_machine(cfg, MachineInfo(gpus=8, launched_world_size=None,
                                   compute_capability=capability, transformer_engine="2.8.0"))


def test_without_fp8_no_machine_need_and_dry_runs_skip_the_check() -> None:
    check_machine(apply_overrides(get_recipe("tiny_dp1"), BF16),
                  MachineInfo(gpus=0, launched_world_size=None))
    dry = apply_overrides(get_recipe("tiny_dp1"), [*FP8, "dry_run=true"])
    check_machine(dry, MachineInfo(gpus=0, launched_world_size=None))


def test_compute_capability_is_the_lowest_nvidia_smi_reports() -> None:
    assert parse_compute_capabilities("9.0\n9.0\n8.0\n") == (8, 0)
    assert parse_compute_capabilities("10.0\n") == (10, 0)
    assert parse_compute_capabilities("[N/A]\n") is None
    assert parse_compute_capabilities("") is None


def test_entry_point_refuses_fp8_here_with_one_line_and_exit_2(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), "recipe=tiny_dp1", *FP8,
         "data.source=synthetic", f"output_dir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: plugins.fp8.format=hybrid needs CUDA GPUs (Transformer Engine's FP8 GEMMs), but "
        "this run would train on the CPU runtime (found 0 GPUs); run on a GPU node or set "
        "plugins.fp8.format=null"
    ]
    assert not any(tmp_path.iterdir())  # refused before any run directory or rank exists


def test_fp8_plugin_turns_what_megatron_refuses_into_one_line(monkeypatch) -> None:
    from megatron.core.transformer import transformer_config

    from plugins.protocol.errors import UserError
    from trainer.mcore_translation import build_transformer_config

    # MoE FP8 needs TE >= 1.7 (transformer_config.py:2294-2300): a TE older than that, staged
    # whether or not one is installed here
    monkeypatch.setattr(transformer_config, "is_te_min_version", lambda *args, **kw: False)
    cfg = apply_overrides(get_recipe("mixtral_tiny_ep1"), [*FP8, "plugins.fp8.recipe=tensorwise"])
    config = build_transformer_config(cfg, cpu_initialization=True)
    with pytest.raises(UserError) as caught:
        cfg.plugins.fp8.build().transformer_config(config)
    assert str(caught.value).startswith(
        "plugins.fp8.format=hybrid with plugins.fp8.recipe=tensorwise: Megatron refuses this "
        "transformer config: Only transformer-engine>=1.7.0 supports MoE FP8 training")


@pytest.mark.parametrize("case", RUN_MACHINE_CASES, ids=[c[0] + ":" + c[1] + " " + " ".join(c[2])
                                                         for c in RUN_MACHINE_CASES])
def test_run_machine_needs_are_megatrons_floors(case, monkeypatch) -> None:
    """Megatron's TransformerConfig, at a staged TE version, refuses each case's run at the
    version the machine check refuses and builds it at the floor the check lets through."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import transformer_config
    from packaging.version import Version

    from plugins.protocol.errors import UserError
    from trainer.mcore_translation import build_transformer_config

    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)  # TE's
    _, recipe, overrides, too_old, floor, _ = case
    for staged, refused in ((too_old, True), (floor, False)):
        monkeypatch.setattr(transformer_config, "get_te_version", lambda v=staged: Version(v))
        monkeypatch.setattr(transformer_config, "is_te_min_version",
                            lambda needed, check_equality=True, v=staged:
                            Version(v) >= Version(needed))
        cfg = apply_overrides(get_recipe(recipe), overrides)
        config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
        if refused:
            with pytest.raises(UserError, match="Megatron refuses this transformer config"):
                cfg.plugins.fp8.build().transformer_config(config)
        else:
            cfg.plugins.fp8.build().transformer_config(config)


# ---- the GPU check (scripts/gpu_check_precision.py, trainer/tools/gpu_check.py) ---------------


def _gpu_check():
    from trainer.tools import gpu_check

    return gpu_check


def test_gpu_check_runs_are_valid_configs() -> None:
    from recipes.resolve import resolve_config

    check = _gpu_check()
    for name, overrides in check.planned_runs().items():
        cfg = resolve_config([*check.run_arguments(overrides), "train.train_iters=50"])
        assert failing(cfg) == [], name
        assert (cfg.model.hidden_size, cfg.model.vocab_size) == (1024, 2048), name


def test_gpu_check_says_in_one_line_why_it_cannot_run_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_precision.py")],
                            capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: no NVIDIA GPU visible here: no /dev/nvidiaN device and no driver listing; run "
        "scripts/gpu_check_precision.py on a GPU node"]


@pytest.mark.parametrize(("pip_output", "reason"), [
    ("WARNING: Retrying ... Failed to establish a new connection: [Errno 101] Network is "
     "unreachable\nERROR: Could not find a version that satisfies the requirement",
     "the package index cannot be reached from this machine (no network)"),
    ("ERROR: No matching distribution found for transformer_engine",
     "no Transformer Engine build on the package index fits this Python/CUDA/platform"),
    ("  error: [Errno 2] No such file or directory: '/usr/local/cuda/bin/nvcc'",
     "building from source needs the CUDA toolkit (nvcc), not found"),
    ("fatal error: cudnn.h: No such file or directory",
     "building from source needs the cuDNN headers, not found"),
    ("ERROR: something else entirely", "ERROR: something else entirely"),
])
def test_gpu_check_names_why_transformer_engine_cannot_be_installed(pip_output, reason) -> None:
    assert _gpu_check().why_pip_failed(pip_output) == reason


# ---- skipped updates in the loop and the run state ------------------------------------------


def _skipped_step(step: int) -> object:
    from plugins.protocol.events import StepMetrics

    return StepMetrics(step=step, loss=5.5, lr=1e-3, grad_norm=float("nan"), loss_tokens=100,
                       step_time_s=0.1, skipped=True)


def _reporter(lines: list[str]):
    return types.SimpleNamespace(print=lines.append)


def _fp16_session(overrides: list[str], scale_now: float):
    from trainer.state import RunState

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=fp16", *overrides])
    optimizer = types.SimpleNamespace(get_loss_scale=lambda: torch.tensor([scale_now]))
    return types.SimpleNamespace(cfg=cfg, state=RunState(step=3), optimizer=optimizer)


def test_a_skipped_update_is_not_a_nonfinite_failure() -> None:
    from trainer.loop import check_finite

    assert check_finite(None, _skipped_step(3)) is None  # grad norm NaN by design, loss finite


def test_skipped_updates_are_counted_and_said() -> None:
    from trainer.loop import record_skipped_update

    session, lines = _fp16_session(["precision.min_loss_scale=1"], 4.0), []
    reporter = _reporter(lines)
    assert record_skipped_update(session, reporter, 3, floored_before=False) is False
    assert session.state.skipped_steps == 1
    assert lines == ["step 3: gradients overflowed; update skipped, loss scale now 4 (1 "
                     "skipped so far)"]


@pytest.mark.parametrize(("overrides", "stops"), [
    (["precision.min_loss_scale=4", "precision.initial_loss_scale=64"], True),
    (["precision.min_loss_scale=4", "precision.initial_loss_scale=64",
      "train.exit_on_nonfinite=false"], False),
])
def test_overflow_at_the_minimum_loss_scale_stops_the_run(overrides, stops) -> None:
    from trainer.loop import NonFiniteError, record_skipped_update

    session = _fp16_session(overrides, 4.0)
    assert record_skipped_update(session, _reporter([]), 2, False) is True  # at the floor now
    if stops:
        with pytest.raises(NonFiniteError, match="gradients overflowed on steps 2 and 3 even "
                           "at precision.min_loss_scale=4; lower optimizer.lr"):
            record_skipped_update(session, _reporter([]), 3, True)
    else:
        record_skipped_update(session, _reporter([]), 3, True)


def test_skipped_steps_are_part_of_the_saved_run_state() -> None:
    from trainer.state import RunState

    state = RunState(step=7, skipped_steps=3)
    assert state.common()["skipped_steps"] == 3
    assert RunState.from_common(state.common(), None).skipped_steps == 3
    older = {key: value for key, value in state.common().items() if key != "skipped_steps"}
    assert RunState.from_common(older, None).skipped_steps == 0  # checkpoints from before


def test_gpu_check_compares_memory_with_the_plan_and_reads_the_runs_fusions() -> None:
    check = _gpu_check()
    run = check.RunResult("bf16", 0, losses=[3.0] * 12, tokens_per_s=[1e5] * 12,
                          tflops=[400.0, 420.0, 410.0], mfu=[0.40, 0.42, 0.41],
                          memory_gib=2.9, planned_gib=2.77,
                          fusions="layers: Transformer Engine's; fusions on: "
                                  "bias_activation_fusion, bias_dropout_fusion, "
                                  "apply_rope_fusion, masked_softmax_fusion, persist_layer_norm, "
                                  "cross_entropy_loss_fusion; off: gradient_accumulation_fusion")
    line, ok = check.memory_check(run)
    assert ok and "is x1.05 the plan's 2.77 GiB (goal within 10%: ok)" in line
    assert not check.memory_check(check.RunResult("x", 0, memory_gib=3.2, planned_gib=2.77))[1]
    assert check.fusion_check(run)[1]
    missing = check.RunResult("y", 0, fusions=run.fusions.replace("apply_rope_fusion, ", ""))
    line, ok = check.fusion_check(missing)
    assert not ok and line.endswith("(MISSING apply_rope_fusion)")
    assert "410.0 model TFLOP/s per GPU, MFU 41.0%, peak 2.90 GiB vs plan 2.77 GiB (x1.05)" in \
        check.describe(run)


def test_megatrons_refusal_of_an_nvfp4_config_is_one_line() -> None:
    """NVFP4 sets Megatron's fp4 fields, not fp8's: a refusal by the transformer config names
    the format and recipe from those (it was a KeyError traceback)."""
    import dataclasses

    from plugins.fp8.plugin import Fp8Plugin
    from plugins.protocol.errors import UserError

    @dataclasses.dataclass
    class Refusing:
        fp4: str | None = None
        fp4_recipe: str | None = None

        def __post_init__(self) -> None:
            if self.fp4:
                raise ValueError("fp4 needs   Transformer Engine >= 2.7")

    plugin = Fp8Plugin({"fp4": "e2m1", "fp4_recipe": "nvfp4"})
    with pytest.raises(UserError, match=r"^plugins.fp8.format=e2m1 with plugins.fp8.recipe=nvfp4: "
                       r"Megatron refuses this transformer config: fp4 needs Transformer Engine "
                       r">= 2.7$"):
        plugin.transformer_config(Refusing())

"""Config of the FP8 plugin (torch-free): the FP8 presets, their rules and machine needs.

FP8 is a plugin, not a core precision field: it is optional and GPU-only, needs Transformer
Engine (TE), brings rules of its own (GEMM shapes; per-recipe limits) and machine needs of its
own (CUDA, TE, compute capability), and changes the run only through the transformer config.
`precision.dtype` and fp16 loss scaling stay core (`recipes/config/schema.py`): every run has a
dtype, and Megatron's optimizer, DDP and Float16Module read it.

The four FP8 presets are `plugins.fp8.recipe` values, trained on top of `precision.dtype=bf16`
(Megatron's `Fp8Recipe`, megatron/core/enums.py:12-19; TE recipe objects chosen in
megatron/core/fp8_utils.py:714-760). Megatron also accepts FP8 with fp32 or fp16 weights, so
this plugin does not refuse them; the layers kept out of FP8 then run in that dtype. FP8
parameters are the exception: with fp32 weights they have no fp32 master to be stepped from.

    delayed     per-tensor scale from an amax history (TE DelayedScaling: amax_history_len,
                amax_compute_algo, margin are read only here, extensions/transformer_engine.py:3246)
    tensorwise  per-tensor current scaling (TE Float8CurrentScaling)
    blockwise   1x128 / 128x128 block scales (TE Float8BlockScaling)
    mxfp8       32-element micro-block scales in E8M0 (TE MXFP8BlockScaling; Blackwell)
    nvfp4       4-bit E2M1 values, an E4M3 scale per 16 and one per tensor (TE NVFP4BlockScaling;
                Blackwell, TE >= 2.7), with `format=e2m1`: Megatron's `fp4` fields, not its
                `fp8` ones (`fp4_utils.py:217-290`), as NVIDIA pretrained Nemotron 3 Super

NVFP4 is a preset of this plugin, not a plugin of its own: the same switch (`format`), the same
BF16 end layers, the same FP8-style needs (CUDA, TE, compute capability) and the same parameter
gather; it differs in the Megatron fields it sets, its GEMM alignment (32 values, 16 bytes) and
its weight bytes (half a byte; its block scales beside them are not counted, as TE's transposed
copies are not). Megatron keeps a hybrid model's MTP block's own projection out of FP4 (the
TODO at `transformer/multi_token_prediction.py:1184`), but its inner layers are numbered from 0
by their own stack and run NVFP4 unless they fall among the first BF16 layers
(`models/hybrid/hybrid_block.py:332-366`): Megatron Core 0.19.2 has no switch that keeps
them in BF16 as NVIDIA did (Bridge's `keep_mtp_spec_in_bf16`).

`param_gather` keeps the GEMM weights in FP8 alone (TE's fp8_model_init; no BF16 copy) and
all-gathers them over data parallel in FP8, as NVIDIA pretrained Nemotron-H and Nano v2.

Every refusal here is a pure function: config rules take the run config, machine rules take the
run config, the machine description and whether the ranks run on CPU. Each returns None or one
line.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from plugins.protocol.hooks import GemmInputs, GemmWeights, Plugin, PluginConfig, Rule

FP8_MULTIPLE = 16  # TE FP8 GEMMs need every matrix dimension divisible by 16
MXFP8_MULTIPLE = 32  # MXFP8 scales blocks of 32 elements (megatron/core/fp8_utils.py:318-323)
NVFP4_MULTIPLE = 32  # FP4 GEMMs need 16-byte (32-value) alignment (megatron/core/fp4_utils.py:183)
FP4_FORMAT, FP4_RECIPE = "e2m1", "nvfp4"  # the one FP4 format and recipe (fp4_utils.py:217-244)
NVFP4_WEIGHT_BYTES = 0.5  # two E2M1 values a byte in the DDP buffer (param_and_grad_buffer.py:1085)
# Lowest compute capability per recipe (TE's check_fp8_support / check_fp8_block_scaling_support
# / check_mxfp8_support in transformer_engine/pytorch/fp8.py or quantization.py).
MIN_COMPUTE_CAPABILITY = {
    "delayed": (8, 9), "tensorwise": (8, 9), "blockwise": (9, 0), "mxfp8": (10, 0),
    "nvfp4": (10, 0),  # NVFP4 GEMMs: Blackwell (B200, GB200) only
}
# Lowest TE per recipe before Megatron refuses it at the first forward (fp8_utils.py:732-765).
MIN_TE_VERSION = {
    "delayed": "1.0", "tensorwise": "2.2.0.dev0", "blockwise": "2.3.0.dev0", "mxfp8": "2.1.0",
    "nvfp4": "2.7.0.dev0",  # fp4_utils.py:32, 219-244
}
# Bytes per element of the quantized copy a TE linear saves of its input for the backward (the
# column-wise data, or the row-wise one where it must all-gather it: the same bytes), scales
# included; Transformer Engine v2.18 (27486e0), transformer_engine/pytorch/: per-tensor FP8 one
# uint8 per value and one fp32 scale per tensor (csrc/quantizer.cpp:663); blockwise 1x128 tiles
# for activations (x_block_scaling_dim=1, common/recipe/__init__.py:431; block_len 128,
# tensor/float8_blockwise_tensor.py:55, 165-173) with an fp32 scale each (csrc/quantizer.cpp:1055);
# MXFP8 an E8M0 byte per 32 values (constants.py:175; csrc/quantizer.cpp:1579-1584); NVFP4 two
# E2M1 values a byte (csrc/quantizer.cpp:84) and an E4M3 byte per 16 (constants.py:177;
# csrc/quantizer.cpp:1984, 2000), plus one fp32 amax per tensor (:1988, 2003, not counted). The
# scale tensors' padding to multiples of 4 and 128 rows is not counted either.
SAVED_INPUT_BYTES = {
    "delayed": 1.0, "tensorwise": 1.0, "blockwise": 1 + 4 / 128, "mxfp8": 1 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
}
DELAYED_ONLY = ("amax_history_len", "amax_compute_algo", "margin")
# Lowest TE for FP8 parameters of a current-scaling or block recipe: below 2.2 Megatron's
# `quantize_param_shard` (which writes the optimizer's fp32 shards into the FP8 parameters after
# each step) handles delayed scaling's Float8Tensor only (fp8_utils.py:372-420 against :420-510).
PARAM_GATHER_MIN_TE = "2.2"
# Lowest TE for FP8 experts, and for FP8 experts in grouped GEMMs (transformer_config.py:
# 2294-2305); for recomputing these modules under FP8 (:1821-1833, spelled "2.6.0dev0" there).
FP8_MOE_MIN_TE, FP8_GROUPED_GEMM_MIN_TE = "1.7.0.dev0", "1.11.0"
FP8_RECOMPUTE_TE_MODULES, FP8_RECOMPUTE_MIN_TE = ("moe_act", "layernorm"), "2.6.0.dev0"


@dataclass(kw_only=True)
class Fp8Config(PluginConfig):
    """FP8 (and NVFP4) training through Transformer Engine (GPU only); off while `format` is
    null."""

    # e4m3 fwd / e5m2 bwd, or e4m3 both; e2m1: NVFP4 (with recipe=nvfp4); None = off
    format: Literal["hybrid", "e4m3", "e2m1"] | None = None
    recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"] = "delayed"  # scaling
    # Delayed scaling only; defaults are TE DelayedScaling's own (Megatron's are 1, most_recent).
    amax_history_len: int = 1024  # steps of amax history per tensor
    amax_compute_algo: Literal["max", "most_recent"] = "max"  # amax taken from that history
    margin: int = 0  # scale = (fp8 max / amax) / 2^margin
    # Transformer layers kept out of FP8 at each end, in precision.dtype (bf16 in every preset);
    # not with delayed scaling.
    first_layers_bf16: int = 0  # layers at the start of the model kept out of FP8
    last_layers_bf16: int = 0  # layers at the end of the model kept out of FP8
    # FP8 parameters: the GEMM weights are kept in FP8 only (no BF16 copy; the distributed
    # optimizer's fp32 shard is the master) and all-gathered over DP in FP8 (Megatron's
    # fp8_param_gather and TransformerConfig.fp8_param; Megatron-LM's --fp8-param-gather).
    param_gather: bool = False

    def rules(self) -> tuple[Rule, ...]:
        return (
            check_fp8_settings_unused, check_fp8_needs_te_layers, check_fp4_format_and_recipe,
            check_fp8_delayed_settings,
            check_fp8_scaling_values, check_fp8_bf16_layers_recipe, check_fp8_bf16_layers_range,
            check_fp8_bf16_layers_leave_fp8, check_fp8_shapes,
            check_fp8_param_gather_distributed, check_fp8_param_gather_master,
            check_fp8_delayed_recompute_modules, check_fp8_param_gather_offload,
        )

    def machine_problem(self, cfg: Any, machine: Any, on_cpu: bool) -> str | None:
        if self.format is None:
            return None
        for check in MACHINE_CHECKS:
            if problem := check(cfg, machine, on_cpu):
                return problem
        return None

    def gpu_checks(self) -> dict[str, list[str]]:
        """Current scaling (compared with BF16 by the GPU check) and a smoke run of every other
        recipe: delayed, current with BF16 end layers, blockwise, MXFP8, NVFP4; then, on a tiny
        hybrid (`_hybrid`), FP8 as NVIDIA pretrained Nemotron-H 47B/56B (tensorwise, 2 + 2
        BF16 end layers, FP8 parameters) and Nano v2 12B (blockwise E4M3, 2 + 2 BF16 end
        layers, FP8 parameters), and on a tiny Super-shaped hybrid (`_super`: latent MoE, MTP)
        NVFP4 as Nemotron 3 Super (the last layers in BF16): the presets of
        `recipes/nemotron/nemotron_h.py` and `recipes/nemotron/nemotron3_super.py`, which a unit
        test holds equal to these. NVFP4 needs Blackwell: elsewhere the run is refused before
        launch in one line."""
        current = ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise"]
        ends = ["plugins.fp8.first_layers_bf16=2", "plugins.fp8.last_layers_bf16=2",
                "plugins.fp8.param_gather=true", "optimizer.distributed=true"]
        nvfp4 = [f"plugins.fp8.format={FP4_FORMAT}", f"plugins.fp8.recipe={FP4_RECIPE}"]
        return {
            "fp8_current": current,
            "fp8_delayed": ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=delayed",
                            "plugins.fp8.amax_history_len=16", "plugins.fp8.margin=0"],
            "fp8_current_bf16_ends": [*current, "plugins.fp8.first_layers_bf16=1",
                                      "plugins.fp8.last_layers_bf16=1"],
            "fp8_blockwise": ["plugins.fp8.format=e4m3", "plugins.fp8.recipe=blockwise"],
            "mxfp8": ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=mxfp8"],
            "nvfp4": nvfp4,
            "nemotron_h_fp8_hybrid": [*current, *ends],
            "nano_v2_fp8_blockwise_hybrid": ["plugins.fp8.format=e4m3",
                                             "plugins.fp8.recipe=blockwise", *ends],
            "nemotron_super_nvfp4_super": [*nvfp4, "plugins.fp8.last_layers_bf16=1"],
        }

    @property
    def fp4(self) -> bool:
        """NVFP4 (`format=e2m1`): Megatron's fp4 fields instead of its fp8 ones."""
        return self.format == FP4_FORMAT

    def _end_layer_args(self) -> list[str]:
        if not (self.first_layers_bf16 or self.last_layers_bf16):
            return []
        return ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
                str(self.first_layers_bf16), "--num-layers-at-end-in-bf16",
                str(self.last_layers_bf16)]

    def megatron_lm_args(self) -> list[str]:
        """Megatron-LM's FP8 (or FP4) flags (none while off); --fp8-param-gather turns on both
        the FP8 parameters and their FP8 all-gather (`megatron/training/argument_utils.py:312`),
        --fp4-param-gather the same in NVFP4 (:313)."""
        if self.format is None:
            return []
        if self.fp4:
            return (["--fp4-format", self.format, "--fp4-recipe", self.recipe,
                     *self._end_layer_args()]
                    + (["--fp4-param-gather"] if self.param_gather else []))
        args = ["--fp8-format", self.format, "--fp8-recipe", self.recipe]
        if self.recipe == "delayed":
            args += ["--fp8-amax-history-len", str(self.amax_history_len),
                     "--fp8-amax-compute-algo", self.amax_compute_algo, "--fp8-margin",
                     str(self.margin)]
        args += self._end_layer_args()
        return args + (["--fp8-param-gather"] if self.param_gather else [])

    def megatron_lm_dests(self) -> tuple[str, ...]:
        return ("fp8", "fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo",
                "fp8_margin", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                "num_layers_at_end_in_bf16", "fp8_param_gather", "fp4", "fp4_recipe",
                "fp4_param_gather")

    def from_megatron_lm(self, values: Any) -> dict[str, Any]:
        """Off without --fp8-format or --fp4-format; the delayed-only settings for delayed
        scaling only (the other recipes never read them, and this plugin refuses them changed)."""
        if values["fp8"] is None and values["fp4"] is None:
            return {}
        if values["fp4"] is not None:
            found = {"format": values["fp4"], "recipe": values["fp4_recipe"],
                     "param_gather": values["fp4_param_gather"]}
        else:
            found = {"format": values["fp8"], "recipe": values["fp8_recipe"],
                     "param_gather": values["fp8_param_gather"]}
        if found["recipe"] == "delayed":
            found.update(amax_history_len=values["fp8_amax_history_len"],
                         amax_compute_algo=values["fp8_amax_compute_algo"],
                         margin=values["fp8_margin"])
        ends = values["first_last_layers_bf16"]
        found["first_layers_bf16"] = values["num_layers_at_start_in_bf16"] if ends else 0
        found["last_layers_bf16"] = values["num_layers_at_end_in_bf16"] if ends else 0
        return found

    def _kept_ends(self) -> dict:
        """The BF16 end layers (`first_last_layers_bf16`), as `KeptEnds` names them."""
        return {"first_layers_kept": self.first_layers_bf16,
                "last_layers_kept": self.last_layers_bf16}

    def gemm_weights(self) -> GemmWeights | None:
        """FP8 parameters hold each GEMM weight of a layer outside the BF16 ends in one byte,
        NVFP4 ones in half a byte, with no BF16 copy beside it (`fp8_param` / `fp4_param`; the
        DDP buffer holds them as uint8, `distributed/param_and_grad_buffer.py:888, 916, 1085`),
        and gather those bytes over DP."""
        if self.format is None or not self.param_gather:
            return None
        return GemmWeights(bytes_per_weight=NVFP4_WEIGHT_BYTES if self.fp4 else 1,
                           **self._kept_ends())

    def gemm_inputs(self) -> GemmInputs | None:
        """Every TE linear of a layer outside the BF16 ends saves its input quantized by the
        recipe instead of in the run's dtype (`SAVED_INPUT_BYTES`; the planner's
        `recipes/plan/activations.py` says which tensors)."""
        if self.format is None:
            return None
        return GemmInputs(bytes_per_element=SAVED_INPUT_BYTES[self.recipe], **self._kept_ends())

    def gemm_precision(self) -> str | None:
        if self.format is None:
            return None
        return "fp4" if self.fp4 else "fp8"

    def transformer_fields(self) -> dict[str, Any]:
        """The Megatron `TransformerConfig` fields this config sets (empty when off)."""
        if self.format is None:
            return {}
        bf16_ends = self.first_layers_bf16 > 0 or self.last_layers_bf16 > 0
        ends = {
            "first_last_layers_bf16": bf16_ends,
            # Megatron reads the counts only when first_last_layers_bf16 is on (fp8_utils.py:675,
            # fp4_utils.py:249-254).
            "num_layers_at_start_in_bf16": self.first_layers_bf16 if bf16_ends else 1,
            "num_layers_at_end_in_bf16": self.last_layers_bf16 if bf16_ends else 1,
        }
        if self.fp4:
            # Each layer runs under TE's NVFP4 autocast, and with fp4_param is built under its
            # fp8_model_init, outside the BF16 ends (fp4_utils.get_fp4_context, :247-290).
            return {"fp4": self.format, "fp4_recipe": self.recipe, **ends,
                    "fp4_param": self.param_gather}
        return {
            "fp8": self.format,
            "fp8_recipe": self.recipe,
            "fp8_amax_history_len": self.amax_history_len,
            "fp8_amax_compute_algo": self.amax_compute_algo,
            "fp8_margin": self.margin,
            **ends,
            # Each layer outside the BF16 ends is built under TE's fp8_model_init
            # (fp8_utils.get_fp8_context(is_init=True), fp8_utils.py:774-823).
            "fp8_param": self.param_gather,
        }

    def ddp_fields(self) -> dict[str, Any]:
        """FP8 (NVFP4) parameters are all-gathered in FP8 (NVFP4) and refreshed from the
        distributed optimizer's fp32 shards (`optimizer/distrib_optimizer.py:2815-2840`)."""
        if not self.param_gather:
            return {}
        return {"fp4_param_gather": True} if self.fp4 else {"fp8_param_gather": True}

    def optimizer_fields(self) -> dict[str, Any]:
        """The distributed optimizer shards FP8 parameters by recipe: block and current-scaling
        tensors are not viewed flat (`optimizer/distrib_optimizer.py:403-409`); NVFP4 ones are
        Megatron's own (`fp4_utils.quantize_nvfp4_param_shard`, :135-174)."""
        return {"fp8_recipe": self.recipe} if self.param_gather and not self.fp4 else {}

    def active(self, cfg: Any) -> bool:
        return self.format is not None

    def build(self) -> Plugin | None:
        from plugins.fp8.plugin import Fp8Plugin

        return Fp8Plugin(self.transformer_fields())


def _default(name: str) -> Any:
    return next(f.default for f in fields(Fp8Config) if f.name == name)


def _on(cfg: Any) -> str:
    """How messages name the switch that is on: `plugins.fp8.format=hybrid`."""
    return f"plugins.fp8.format={cfg.plugins.fp8.format}"


# ---- config rules (pure functions of the run config) ----------------------------------------


def check_fp8_settings_unused(cfg: Any) -> str | None:
    """FP8 settings changed while FP8 is off would silently do nothing."""
    fp8 = cfg.plugins.fp8
    if fp8.format is not None:
        return None
    for f in fields(fp8):
        if f.name != "format" and getattr(fp8, f.name) != f.default:
            return (
                f"plugins.fp8.{f.name}={getattr(fp8, f.name)} has no effect while "
                "plugins.fp8.format=null; turn FP8 on with plugins.fp8.format=hybrid or leave "
                f"plugins.fp8.{f.name} at its default"
            )
    return None


def check_fp8_needs_te_layers(cfg: Any) -> str | None:
    """FP8 runs in Transformer Engine's linears: Megatron's local layers never read the FP8
    fields (gpt_layer_specs.py:194, 352: TE modules are "required for fp8 training"), so
    `model.transformer_impl=local` would train in BF16 while the run says FP8. (CPU ranks,
    where `auto` builds the local layers, are refused by the machine check.)"""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or cfg.model.transformer_impl != "local":
        return None
    return (f"plugins.fp8.format={fp8.format} runs in Transformer Engine's layers, but "
            "model.transformer_impl=local builds Megatron's own, which never use FP8; set "
            "model.transformer_impl=auto or plugins.fp8.format=null")


def check_fp4_format_and_recipe(cfg: Any) -> str | None:
    """NVFP4 is one format with one recipe: E2M1 values scaled by `nvfp4` (Megatron's fp4 and
    fp4_recipe, `transformer_config.py:652-660`); no FP8 recipe scales E2M1, and `nvfp4` scales
    nothing else."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or (fp8.format == FP4_FORMAT) == (fp8.recipe == FP4_RECIPE):
        return None
    if fp8.format == FP4_FORMAT:
        return (f"plugins.fp8.format={FP4_FORMAT} (NVFP4) is scaled by plugins.fp8.recipe="
                f"{FP4_RECIPE}, not {fp8.recipe}; set plugins.fp8.recipe={FP4_RECIPE}")
    return (f"plugins.fp8.recipe={FP4_RECIPE} scales 4-bit E2M1 values, but plugins.fp8.format="
            f"{fp8.format}; set plugins.fp8.format={FP4_FORMAT} for NVFP4, or an FP8 recipe")


def check_fp8_delayed_settings(cfg: Any) -> str | None:
    """Only TE's DelayedScaling reads amax history, its algorithm and the margin
    (megatron/core/extensions/transformer_engine.py:3246-3252); other recipes ignore them."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or fp8.recipe == "delayed":
        return None
    for name in DELAYED_ONLY:
        if getattr(fp8, name) != _default(name):
            return (
                f"plugins.fp8.{name}={getattr(fp8, name)} is read only by delayed scaling, but "
                f"plugins.fp8.recipe={fp8.recipe}; set plugins.fp8.recipe=delayed or leave "
                f"plugins.fp8.{name} at its default"
            )
    return None


def check_fp8_scaling_values(cfg: Any) -> str | None:
    """An empty amax history or a negative margin reach TE only inside the first forward."""
    fp8 = cfg.plugins.fp8
    if fp8.amax_history_len < 1:
        return (
            f"plugins.fp8.amax_history_len={fp8.amax_history_len} must be at least 1; set it, "
            "e.g. plugins.fp8.amax_history_len=1024"
        )
    for name in ("margin", "first_layers_bf16", "last_layers_bf16"):
        if getattr(fp8, name) < 0:
            return f"plugins.fp8.{name}={getattr(fp8, name)} must not be negative; set it to 0"
    return None


def check_fp8_bf16_layers_recipe(cfg: Any) -> str | None:
    """Megatron refuses bf16 end layers with delayed scaling (transformer_config.py:1402): the
    per-layer FP8 context would break its amax reduction (fp8_utils.py:826-830)."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or fp8.recipe != "delayed":
        return None
    for name in ("first_layers_bf16", "last_layers_bf16"):
        if getattr(fp8, name) > 0:
            return (
                f"plugins.fp8.{name}={getattr(fp8, name)} cannot be used with "
                "plugins.fp8.recipe=delayed (Megatron refuses bf16 layers with delayed scaling); "
                f"set plugins.fp8.recipe=tensorwise or plugins.fp8.{name}=0"
            )
    return None


def check_fp8_bf16_layers_range(cfg: Any) -> str | None:
    """Megatron allows at most one pipeline stage's layers at each end
    (transformer_config.py:1404-1430)."""
    fp8 = cfg.plugins.fp8
    per_stage = cfg.model.num_layers // cfg.parallel.pipeline
    if fp8.format is None:
        return None
    for name in ("first_layers_bf16", "last_layers_bf16"):
        if getattr(fp8, name) > per_stage:
            return (
                f"plugins.fp8.{name}={getattr(fp8, name)} exceeds the {per_stage} layers of one "
                f"pipeline stage (model.num_layers={cfg.model.num_layers} / "
                f"parallel.pipeline={cfg.parallel.pipeline}); lower it to {per_stage} or less"
            )
    return None


def check_fp8_bf16_layers_leave_fp8(cfg: Any) -> str | None:
    """Keeping every layer in bf16 would train without FP8 while claiming it (house rule)."""
    fp8 = cfg.plugins.fp8
    kept = fp8.first_layers_bf16 + fp8.last_layers_bf16
    if fp8.format is None or kept < cfg.model.num_layers:
        return None
    return (
        f"plugins.fp8.first_layers_bf16={fp8.first_layers_bf16} + "
        f"plugins.fp8.last_layers_bf16={fp8.last_layers_bf16} keep all "
        f"{cfg.model.num_layers} layers in bf16, so nothing trains in FP8; lower them or set "
        "plugins.fp8.format=null"
    )


def check_fp8_param_gather_distributed(cfg: Any) -> str | None:
    """FP8 parameters are refreshed from fp32 master weights only by the distributed optimizer
    (`optimizer/distrib_optimizer.py:2815-2840`; the plain one has no such step), which
    Megatron-LM asserts (`megatron/training/arguments.py:1060-1062`)."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or not fp8.param_gather or cfg.optimizer.distributed:
        return None
    return ("plugins.fp8.param_gather=true keeps the weights in FP8 and refreshes them from the "
            "distributed optimizer's fp32 shards, but optimizer.distributed=false; set "
            "optimizer.distributed=true or plugins.fp8.param_gather=false")


def check_fp8_param_gather_master(cfg: Any) -> str | None:
    """FP8 (NVFP4) parameters are stepped through an fp32 master shard that Megatron's
    distributed optimizer keeps for bf16/fp16 weights only (`optimizer/distrib_optimizer.py:
    401-462`). TE's quantized weights keep the dtype they are built in, so an fp32 run's are
    fp32 tensors to the optimizer, whose shard is then a slice of the quantized weight itself
    (:466-474): no master, the update rounded to FP8. Megatron-LM does not refuse it."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None or not fp8.param_gather or cfg.precision.dtype != "fp32":
        return None
    return ("plugins.fp8.param_gather=true with precision.dtype=fp32: FP8 weights are refreshed "
            "from the fp32 master copy Megatron's optimizer keeps for bf16/fp16 weights only "
            "(fp32 weights are stepped in place); set precision.dtype=bf16 or "
            "plugins.fp8.param_gather=false")


def check_fp8_delayed_recompute_modules(cfg: Any) -> str | None:
    """Delayed scaling cannot recompute the MoE activation or the norms, whose outputs it
    would quantize again with a moved amax history (transformer_config.py:1822-1827)."""
    fp8, t = cfg.plugins.fp8, cfg.train
    if fp8.format is None or fp8.recipe != "delayed" or t.recompute != "selective":
        return None
    found = [m for m in FP8_RECOMPUTE_TE_MODULES if m in t.recompute_modules]
    if not found:
        return None
    return (f"train.recompute_modules has {found[0]}, which Megatron cannot recompute with "
            "plugins.fp8.recipe=delayed; use plugins.fp8.recipe=tensorwise or remove "
            f"{found[0]}")


def check_fp8_param_gather_offload(cfg: Any) -> str | None:
    """With FP8 parameters, optimizer offload takes delayed scaling only (Megatron-LM asserts
    it, `megatron/training/arguments.py:1808-1811`)."""
    fp8 = cfg.plugins.fp8
    if (fp8.format is None or not fp8.param_gather or fp8.recipe == "delayed"
            or not cfg.optimizer.cpu_offload):
        return None
    return (f"plugins.fp8.param_gather=true with plugins.fp8.recipe={fp8.recipe} and "
            "optimizer.cpu_offload=true: Megatron offloads FP8 parameters with delayed scaling "
            "only; set plugins.fp8.recipe=delayed, plugins.fp8.param_gather=false or "
            "optimizer.cpu_offload=false")


def _gemm_dims(cfg: Any) -> dict[str, int | None]:
    m, p = cfg.model, cfg.parallel
    sp_split = p.tensor if p.sequence_parallel else 1
    tokens = m.seq_length // (p.context * sp_split) * cfg.train.micro_batch_size
    return {
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "model.moe_latent_size": m.moe_latent_size,
        "model.ffn_hidden_size / parallel.tensor (the MLP width on one TP rank)": (
            m.ffn_hidden_size // p.tensor
        ),
        "tokens per rank per micro-batch (seq_length / CP [/ TP with SP] x micro_batch_size)": (
            tokens
        ),
    }


def check_fp8_shapes(cfg: Any) -> str | None:
    """FP8 GEMMs need hidden, MLP, latent and per-rank token dimensions that are multiples of
    16 (32 for MXFP8, whose scales cover blocks of 32, and for NVFP4, aligned to 16 bytes)."""
    fp8 = cfg.plugins.fp8
    if fp8.format is None:
        return None
    multiple = {"mxfp8": MXFP8_MULTIPLE, FP4_RECIPE: NVFP4_MULTIPLE}.get(fp8.recipe, FP8_MULTIPLE)
    what = f"plugins.fp8.recipe={fp8.recipe}" if multiple > FP8_MULTIPLE else _on(cfg)
    for name, value in _gemm_dims(cfg).items():
        if value is not None and value % multiple:
            return (
                f"{what} needs {name} divisible by {multiple}, got {value}; adjust it or set "
                "plugins.fp8.format=null"
            )
    return None


# ---- machine rules (this config, the machine description, whether ranks run on CPU) ---------


def fp8_needs_cuda(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    fp8 = cfg.plugins.fp8
    if not on_cpu and machine.gpus > 0:
        return None
    found = f"found {machine.gpus} GPU{'' if machine.gpus == 1 else 's'}"
    where = "the CPU runtime" if on_cpu else "no GPU"
    gemms = "NVFP4 GEMMs, on Blackwell" if fp8.fp4 else "FP8 GEMMs"
    return (
        f"plugins.fp8.format={fp8.format} needs CUDA GPUs (Transformer Engine's {gemms}), but "
        f"this run would train on {where} ({found}); run on a GPU node or set "
        "plugins.fp8.format=null"
    )


def fp8_needs_transformer_engine(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    if machine.transformer_engine is not None:
        return None
    return (
        f"plugins.fp8.format={cfg.plugins.fp8.format} needs Transformer Engine, which is not "
        "installed here (without it Megatron silently trains without FP8); install it with pip "
        "install --no-build-isolation 'transformer_engine[pytorch]' or set "
        "plugins.fp8.format=null"
    )


def fp8_transformer_engine_version(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    fp8 = cfg.plugins.fp8
    found, needed = machine.transformer_engine, MIN_TE_VERSION[fp8.recipe]
    if not machine.transformer_engine_below(needed):
        return None
    return (
        f"plugins.fp8.recipe={fp8.recipe} needs Transformer Engine >= {needed} (Megatron refuses "
        f"it otherwise), found {found}; upgrade Transformer Engine or set "
        "plugins.fp8.recipe=delayed"
    )


def fp8_moe_transformer_engine(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    """FP8 experts need TE >= 1.7 (experts that receive no token), and >= 1.11 in grouped
    GEMMs (`transformer_config.py:2294-2305`): below every recipe's own floor but delayed's."""
    m, found = cfg.model, machine.transformer_engine
    if not m.num_moe_experts:
        return None
    grouped = m.moe_grouped_gemm
    needed = FP8_GROUPED_GEMM_MIN_TE if grouped else FP8_MOE_MIN_TE
    if not machine.transformer_engine_below(needed):
        return None
    what = "in grouped GEMMs (model.moe_grouped_gemm=true)" if grouped else "on experts"
    also = " or model.moe_grouped_gemm=false" if grouped and not (
        machine.transformer_engine_below(FP8_MOE_MIN_TE)) else ""
    return (
        f"model.num_moe_experts={m.num_moe_experts} with plugins.fp8.format="
        f"{cfg.plugins.fp8.format}: FP8 {what} needs Transformer Engine >= {needed}, found "
        f"{found}; upgrade Transformer Engine or set plugins.fp8.format=null{also}"
    )


def fp8_recompute_transformer_engine(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    """Recomputing the MoE activation or the norms under FP8 needs TE >= 2.6
    (`transformer_config.py:1821-1833`; with delayed scaling never, a config rule)."""
    t, found = cfg.train, machine.transformer_engine
    if t.recompute != "selective":
        return None
    modules = [m for m in FP8_RECOMPUTE_TE_MODULES if m in t.recompute_modules]
    if not modules or not machine.transformer_engine_below(FP8_RECOMPUTE_MIN_TE):
        return None
    return (
        f"train.recompute_modules has {modules[0]}, which Megatron recomputes under "
        f"plugins.fp8.format={cfg.plugins.fp8.format} only with Transformer Engine >= "
        f"{FP8_RECOMPUTE_MIN_TE}, found {found}; upgrade Transformer Engine or remove "
        f"{modules[0]}"
    )


def fp8_compute_capability(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    fp8 = cfg.plugins.fp8
    found = machine.compute_capability
    needed = MIN_COMPUTE_CAPABILITY[fp8.recipe]
    if found is None or tuple(found) >= needed:
        return None
    where = " (NVFP4 GEMMs run on Blackwell: B200, GB200)" if fp8.fp4 else ""
    if fp8.fp4 and tuple(found) >= (8, 9):  # an FP8 recipe is another format too
        hint = ("plugins.fp8.format=hybrid plugins.fp8.recipe=tensorwise (FP8) or "
                "plugins.fp8.format=null (bf16 alone)")
    elif needed > (8, 9) and tuple(found) >= (8, 9):
        hint = "plugins.fp8.recipe=tensorwise"
    else:
        hint = "plugins.fp8.format=null (bf16 alone)"
    return (
        f"plugins.fp8.recipe={fp8.recipe} needs GPU compute capability "
        f"{needed[0]}.{needed[1]} or higher, this GPU has {found[0]}.{found[1]}{where}; use "
        f"{hint}"
    )


def fp8_param_gather_transformer_engine(cfg: Any, machine: Any, on_cpu: bool) -> str | None:
    fp8, found = cfg.plugins.fp8, machine.transformer_engine
    if not fp8.param_gather or fp8.recipe == "delayed" or not (
            machine.transformer_engine_below(PARAM_GATHER_MIN_TE)):
        return None
    return (
        f"plugins.fp8.param_gather=true with plugins.fp8.recipe={fp8.recipe} needs Transformer "
        f"Engine >= {PARAM_GATHER_MIN_TE} (Megatron writes the optimizer's fp32 weights into "
        f"{fp8.recipe} FP8 parameters only from there on), found {found}; upgrade Transformer "
        "Engine or set plugins.fp8.param_gather=false"
    )


MACHINE_CHECKS = (
    fp8_needs_cuda, fp8_needs_transformer_engine, fp8_transformer_engine_version,
    fp8_moe_transformer_engine, fp8_recompute_transformer_engine,
    fp8_compute_capability, fp8_param_gather_transformer_engine,
)

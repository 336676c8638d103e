"""Every GPU recipe with a Megatron Bridge counterpart turns on the fast paths Bridge's recipe or
performance config turns on: each recipe's TransformerConfig (Transformer Engine's layers),
DDP and optimizer configs are built on CPU and their performance fields compared, field by
field, with the table below, written from Bridge's sources (each row cites the file, commit and
lines). Where a recipe here knowingly differs, `DIFFERS` says why; nothing else may differ.
"""

from __future__ import annotations

import pytest
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers
from megatron.core.transformer.moe import moe_utils

from recipes.registry import RECIPES, get_recipe
from trainer.mcore_translation import (
    build_ddp_config,
    build_optimizer_config,
    build_transformer_config,
)

B = "NVIDIA-NeMo/Megatron-Bridge"
LLAMA = f"{B}@38b4a06:src/megatron/bridge/recipes/llama/llama3.py"
GPT_PROVIDER = f"{B}@38b4a06:src/megatron/bridge/models/gpt_provider.py"
COMMON = f"{B}@38b4a06:src/megatron/bridge/recipes/common.py"
OVERLAP = f"{B}@38b4a06:src/megatron/bridge/training/comm_overlap.py"
MIXTRAL = f"{B}@f34e453:src/megatron/bridge/recipes/mixtral/mixtral.py"
MIXTRAL_PROVIDER = f"{B}@f34e453:src/megatron/bridge/models/mixtral/mixtral_provider.py"
NEMOTRON_H = f"{B}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotronh.py"
NANO_V2 = f"{B}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotron_nano_v2.py"
NANO3 = f"{B}@38b4a06:src/megatron/bridge/recipes/nemotronh/nemotron_3_nano.py"
H_PERF = f"{B}@38b4a06:scripts/performance/configs/nemotronh/nemotronh_workload_base_configs.py"
N3_PERF = (f"{B}@38b4a06:scripts/performance/configs/nemotronh/"
           "nemotron_3_workload_base_configs.py")
SUPER = f"{B}@53d40d1:src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py"
SUPER_PROVIDER = f"{B}@53d40d1:src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
LLAMA_8B_PERF = f"{B}@0813a3f:scripts/performance/configs/llama3/llama3_8b_llm_pretrain.py"
FSDP_PERF = f"{B}@0813a3f:scripts/performance/utils/helpers.py (set_megatron_fsdp_overrides)"

# What every Bridge pretraining recipe of these families has (its GPT/Mamba provider's fusions,
# the common DDP config and the distributed optimizer).
EVERY = {
    "masked_softmax_fusion": (True, f"{GPT_PROVIDER}:198"),
    "cross_entropy_loss_fusion": (True, f"{GPT_PROVIDER}:199"),
    "gradient_accumulation_fusion": (True, f"{GPT_PROVIDER}:200 (TE or APEX present)"),
    "bias_dropout_fusion": (True, f"{GPT_PROVIDER}:396 (bias_dropout_add_fusion)"),
    "ddp.overlap_grad_reduce": (True, f"{COMMON}:83"),
    "ddp.use_distributed_optimizer": (True, f"{COMMON}:86"),
    "optimizer.use_distributed_optimizer": (True, f"{COMMON}:86"),
    "cuda_graph_impl": ("none", "each recipe: cfg.model.cuda_graph_impl = 'none'"),
    "tp_comm_overlap": (False, f"{COMMON}:127 (comm_overlap=None)"),
    "recompute_granularity": (None, "each recipe: cfg.model.recompute_granularity = None"),
    "fine_grained_activation_offloading": (False, "each recipe: = False"),
}


def tp_overlap(where: str) -> dict:
    return {"tp_comm_overlap": (True, f"{where}; {OVERLAP}:442-451 (TP >= 2 with SP)")}


LLAMA_8B = {"recompute_granularity": (None, f"{LLAMA}:273")}
LLAMA_70B = tp_overlap(f"{LLAMA}:737-741")
LLAMA_405B = tp_overlap(f"{LLAMA}:1201-1205")
MIXTRAL_8X7B = {
    "moe_token_dispatcher_type": ("alltoall", f"{MIXTRAL_PROVIDER}:82"),
    "moe_grouped_gemm": (True, f"{MIXTRAL_PROVIDER}:81"),
    "moe_permute_fusion": (True, f"{MIXTRAL_PROVIDER}:83"),
    "moe_shared_expert_overlap": (False, f"{MIXTRAL_PROVIDER}:80"),
    "recompute_granularity": ("selective", f"{MIXTRAL}:276-278"),
    "recompute_modules": (["core_attn"], "Megatron's default (transformer_config.py:1763)"),
}
NEMOTRON_H_TP1 = {"tp_comm_overlap": (False, f"{NEMOTRON_H}:141-144 asks; {OVERLAP}:442-447 "
                                             "turns it off below TP2")}
NANO3_FAST = {
    "moe_token_dispatcher_type": ("flex", f"{NANO3}:105"),
    "moe_flex_dispatcher_backend": ("hybridep", f"{N3_PERF}:37"),
    "moe_grouped_gemm": (True, f"{NANO3}:128"),
    "moe_permute_fusion": (True, f"{NANO3}:127"),
    "moe_router_fusion": (False, f"{NANO3}:126"),
    "moe_shared_expert_overlap": (False, f"{NANO3}:169"),
    "use_fused_weighted_squared_relu": (True, f"{NANO3}:190"),
    "overlap_moe_expert_parallel_comm": (False, f"{NANO3}:168"),
    **tp_overlap(f"{NANO3}:163-166"),
    "cuda_graph_impl": ("transformer_engine", f"{N3_PERF}:74-80"),
    "cuda_graph_modules": (["attn", "mamba"], f"{N3_PERF}:85"),
    "recompute_granularity": ("selective", f"{N3_PERF}:84"),
    "recompute_modules": (["moe", "layernorm"], f"{N3_PERF}:84"),
}
SUPER_FAST = {
    "moe_token_dispatcher_type": ("alltoall", f"{SUPER}:65"),
    "moe_grouped_gemm": (True, f"{SUPER_PROVIDER}:53"),
    "moe_permute_fusion": (True, f"{SUPER_PROVIDER}:55"),
    "moe_router_fusion": (False, "not set: Megatron's default"),
    "moe_shared_expert_overlap": (False, f"{SUPER}:66"),
    "use_fused_weighted_squared_relu": (True, f"{SUPER}:131"),
    "ddp.overlap_param_gather": (True, f"{SUPER}:123"),
    "cuda_graph_impl": ("transformer_engine", f"{SUPER}:83"),
    "cuda_graph_modules": (["attn", "mamba", "moe_router", "moe_preprocess"], f"{SUPER}:84"),
    "recompute_granularity": (None, "not set: _pretrain_common's none"),
}
SUPER_RECIPES = ("nemotron3_super_120b_a12b_tp4_sp_ep64_dp16",
                 "nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16")

TABLE: dict[str, dict] = {
    "llama3_8b_tp8_dp8": LLAMA_8B,
    "llama3_8b_tp8_pp4_dp2": LLAMA_8B,
    "llama3_8b_128k_tp8_cp8": LLAMA_8B,
    "llama3_8b_fsdp_dp8": {
        **LLAMA_8B,
        "ddp.use_megatron_fsdp": (True, FSDP_PERF),
        "ddp.data_parallel_sharding_strategy": ("optim_grads_params", FSDP_PERF),
        "ddp.average_in_collective": (False, FSDP_PERF),
        # set_megatron_fsdp_overrides turns it on; the "cs" branch then off again
        "gradient_accumulation_fusion": (False, f"{LLAMA_8B_PERF} (llama3_8b_h100_8gpus_fp8_"
                                                "config, fp8_recipe 'cs')"),
        "ddp.fp8_param_gather": (True, f"{LLAMA_8B_PERF} (fp8_param_gather)"),
    },
    "llama3_70b_tp4_pp4_cp2_vpp5_dp2": LLAMA_70B,
    "llama31_405b_tp8_pp16_dp64": LLAMA_405B,
    "llama31_405b_tp8_pp16_dp128": LLAMA_405B,
    "llama31_405b_128k_tp8_cp16_pp16_dp8": LLAMA_405B,
    "mixtral_8x7b_tp1_pp4_ep8_dp16": MIXTRAL_8X7B,
    "nemotron_h_4b_tp1_dp64": NEMOTRON_H_TP1,
    "nemotron_h_8b_tp2_sp_dp32": tp_overlap(f"{NEMOTRON_H}:273-276"),
    "nemotron_h_47b_tp8_sp_dp8": tp_overlap(f"{NEMOTRON_H}:409-412"),
    "nemotron_h_56b_tp8_sp_dp8": {
        **tp_overlap(f"{NEMOTRON_H}:546-549"),
        "cuda_graph_impl": ("transformer_engine", f"{H_PERF}:29-33"),
        "cuda_graph_modules": (["mamba"], f"{H_PERF}:68-72 (H100 FP8)"),
        "ddp.fp8_param_gather": (True, "mixed_precision.py:307-325 (fp8_param_gather)"),
    },
    "nemotron_nano_v2_9b_tp2_sp_dp32": tp_overlap(f"{NANO_V2}:140-143"),
    "nemotron_nano_v2_12b_tp4_sp_dp16": {
        "tp_comm_overlap": (False, f"{NANO_V2}:275 (comm_overlap=None: FP8)")},
    "nemotron_nano_v2_12b_phases_tp4_sp_dp16": {
        "tp_comm_overlap": (False, f"{NANO_V2}:275 (comm_overlap=None: FP8)")},
    "nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16": NANO3_FAST,
    "nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16": NANO3_FAST,
    **{name: SUPER_FAST for name in SUPER_RECIPES},
}

# Where a recipe here knowingly differs from its Bridge counterpart, and why.
DIFFERS: dict[tuple[str, str], tuple[object, str]] = {
    ("llama3_8b_128k_tp8_cp8", "recompute_granularity"): (
        "full", "this recipe's 128k layout holds 16k tokens per CP rank and recomputes fully "
                f"(Bridge's 128k recipe: none, {LLAMA}:516, at TP4 x PP2 x CP8)"),
    **{(name, field): value for name in SUPER_RECIPES for field, value in {
        "recompute_granularity": ("full", "Bridge trains on B200 at EP8; here 80-GB GPUs hold "
                                          "the 88 layers' activations only when recomputed"),
        "cuda_graph_impl": ("none", "Megatron graphs a fully recomputed layer only in a "
                                    "full-iteration graph"),
        "cuda_graph_modules": ([], "no graphs (above)")}.items()},
    # TE's graph replay takes no packed rows (transformer_layer.py:1225-1231), and a phase
    # cannot change the graphs.
    ("nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16", "cuda_graph_impl"): (
        "none", f"its long-context phase trains packed rows ({N3_PERF}:74-80: graphs)"),
    ("nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16", "cuda_graph_modules"): (
        [], "no graphs (above)"),
}


@pytest.fixture
def te_kernels(monkeypatch):
    """What TransformerConfig checks for on a GPU node with Transformer Engine (a recent one:
    Megatron FSDP's gradient-accumulation fusion needs TE >= 2.10)."""
    from trainer import mcore_translation

    monkeypatch.setattr(mcore_translation, "_te_at_least", lambda version: True)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        monkeypatch.setattr(moe_utils, name, lambda *args: None)


def _field(configs: dict, name: str):
    section, _, field = name.rpartition(".")
    value = getattr(configs[section or "transformer"], field)
    if field == "cuda_graph_modules":
        return [module.name for module in value]
    return value


def test_the_table_covers_every_gpu_recipe_with_a_bridge_counterpart():
    families = ("llama3_", "llama31_", "mixtral_8x7b", "nemotron_h_", "nemotron_nano_v2",
                "nemotron3_nano", "nemotron3_super")
    assert set(TABLE) == {name for name in RECIPES if name.startswith(families)}


@pytest.mark.parametrize("name", list(TABLE))
def test_each_gpu_recipe_has_bridges_fast_paths(name, te_kernels):
    cfg = get_recipe(name)
    configs = {
        "transformer": build_transformer_config(cfg, cpu_initialization=False,
                                                transformer_engine=True),
        "ddp": build_ddp_config(cfg),
        "optimizer": build_optimizer_config(cfg),
    }
    expected = {**EVERY, **TABLE[name]}
    for field, (value, where) in expected.items():
        if (name, field) in DIFFERS:
            value = DIFFERS[name, field][0]
        assert _field(configs, field) == value, f"{name}: {field} (Bridge: {where})"


def test_without_apex_transformer_engine_still_fuses_the_weight_gradients(te_kernels,
                                                                          monkeypatch):
    """TE's linears fuse the wgrad accumulation themselves; the model build keeps Megatron's own
    output layer unfused (the wgrad_fusion_without_apex patch, test_gpu_fast_paths.py)."""
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    config = build_transformer_config(get_recipe("llama3_8b_tp8_dp8"), cpu_initialization=False,
                                      transformer_engine=True)
    assert config.gradient_accumulation_fusion

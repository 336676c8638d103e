"""Llama 3 family: the 8B and 70B shapes and their 64-GPU layouts (configurations A and B of
docs/reference-configurations.md are the two 8B ones)."""

from __future__ import annotations

from recipes.base_64gpu import large_run_base
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig


def llama3_8b_model() -> ModelConfig:
    """Llama-3-8B shape: GQA 32/8, SwiGLU, RMSNorm, RoPE 500k, no bias, untied."""
    return ModelConfig(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        seq_length=8192,
        vocab_size=128256,
        activation="swiglu",
        normalization="RMSNorm",
        position_embedding="rope",
        rotary_base=500_000,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        init_method_std=0.02,
    )


# The Llama 3 paper's peak learning rates (The Llama 3 Herd of Models, arXiv 2407.21783,
# Table 3): 8B 3e-4, 70B 1.5e-4, 405B 8e-5; its other pretraining settings are for the 405B
# (section 3.4.1, recipes/llama31.py).
LLAMA3_PAPER = "The Llama 3 Herd of Models (arXiv 2407.21783)"


def llama3_8b_base() -> RunConfig:
    """Llama-3-8B on 8 x 8 GPUs, the paper's peak learning rate (LLAMA3_PAPER, Table 3);
    layout and batch are left to the recipe."""
    return large_run_base(llama3_8b_model(), lr=3e-4)


def llama3_8b_tp8_dp8() -> RunConfig:
    """Llama-3-8B, config A: TP8 inside each node x 8 data-parallel replicas (64 GPUs)."""
    cfg = llama3_8b_base()
    cfg.parallel = ParallelConfig(tensor=8, sequence_parallel=True)
    # 2 sequences per replica, 8 accumulation steps -> 2 x 8 x 8 = 128.
    cfg.train.micro_batch_size = 2
    cfg.train.global_batch_size = 128
    return cfg


def llama3_8b_tp8_pp4_dp2() -> RunConfig:
    """Llama-3-8B, config B: TP8 x PP4 (one node per stage, 8 layers each) x DP2 (64 GPUs)."""
    cfg = llama3_8b_base()
    cfg.parallel = ParallelConfig(tensor=8, pipeline=4, sequence_parallel=True)
    # Same micro-batch and accumulation as config A -> 2 x 2 x 8 = 32; compare
    # with config A at equal batch via train.global_batch_size=128 (32 accumulation steps).
    cfg.train.micro_batch_size = 2
    cfg.train.global_batch_size = 32
    return cfg


# Megatron Bridge's Llama 3 8B performance configuration on 8 H100s with FP8 current scaling
# (`llama3_8b_h100_8gpus_fp8_config`, fp8_recipe "cs"), and the Megatron FSDP settings it
# applies (`set_megatron_fsdp_overrides`).
BRIDGE_8B_H100 = ("NVIDIA-NeMo/Megatron-Bridge@0813a3f1f791c336f49aad1862ade65410c20788:"
                  "scripts/performance/configs/llama3/llama3_8b_llm_pretrain.py")
BRIDGE_FSDP = ("NVIDIA-NeMo/Megatron-Bridge@0813a3f1f791c336f49aad1862ade65410c20788:"
               "scripts/performance/utils/helpers.py:64-86")


def llama3_8b_fsdp_dp8() -> RunConfig:
    """Llama-3-8B on one node of 8 H100s as Megatron Bridge's performance configuration trains
    it: TP1 x DP8 under Megatron FSDP (optim_grads_params, ZeRO-3), FP8 current scaling with
    FP8 parameters, micro-batch 1, global batch 128.

    From BRIDGE_8B_H100 (`llama3_8b_h100_8gpus_fp8_config`, fp8_recipe "cs": TP1 PP1 CP1,
    micro 1, global 128, sequence 8192, gradients reduced in BF16; FP8 hybrid, tensorwise,
    fp8_param_gather, no BF16 end layers; its "cs" branch turns gradient-accumulation fusion
    off after the FSDP settings) and BRIDGE_FSDP (use_megatron_fsdp,
    data_parallel_sharding_strategy optim_grads_params, no average in the collective).
    Bridge's nccl_ub, FP8 transpose cache and meta-device init have no field here."""
    cfg = llama3_8b_base()
    cfg.cluster.nodes = 1
    cfg.parallel = ParallelConfig()
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = 128
    cfg.precision.grad_reduce_in_fp32 = False
    cfg.optimizer.fsdp = "optim_grads_params"
    cfg.plugins.fp8.format = "hybrid"
    cfg.plugins.fp8.recipe = "tensorwise"
    cfg.plugins.fp8.param_gather = True
    cfg.model.gradient_accumulation_fusion = False
    return cfg


def llama3_8b_128k_tp8_cp8() -> RunConfig:
    """Llama-3-8B at 128k tokens: TP8 + SP x CP8, one replica over 64 GPUs."""
    cfg = llama3_8b_base()
    cfg.model.seq_length = 131_072
    cfg.parallel = ParallelConfig(tensor=8, context=8, sequence_parallel=True)
    cfg.train.global_batch_size = 16  # 16 x 128k = 2M tokens per step
    cfg.train.recompute = "full"  # 16k tokens per CP rank: recompute keeps activations small
    return cfg


def llama3_70b_model() -> ModelConfig:
    """Llama-3-70B shape: 80 layers, GQA 64/8, SwiGLU, RMSNorm, RoPE 500k, no bias, untied."""
    model = llama3_8b_model()
    model.num_layers = 80
    model.hidden_size = 8192
    model.ffn_hidden_size = 28672
    model.num_attention_heads = 64
    model.num_query_groups = 8
    return model


def llama3_70b_tp4_pp4_cp2_vpp5_dp2() -> RunConfig:
    """Llama-3-70B on 64 GPUs: TP4 + SP x PP4 interleaved (5 chunks of 4 layers) x CP2 x DP2;
    the paper's peak learning rate (LLAMA3_PAPER, Table 3)."""
    cfg = large_run_base(llama3_70b_model(), lr=1.5e-4)
    # TP communication overlap as Megatron Bridge's 70B recipe, the same layout (NVIDIA-NeMo/
    # Megatron-Bridge@38b4a06:src/megatron/bridge/recipes/llama/llama3.py:737-741).
    cfg.parallel = ParallelConfig(
        tensor=4, pipeline=4, virtual_pipeline=5, context=2, sequence_parallel=True,
        tp_comm_overlap=True,
    )
    cfg.train.global_batch_size = 128  # 64 micro-batches per step: divisible by PP4
    return cfg


RECIPES = (
    llama3_8b_tp8_dp8,
    llama3_8b_tp8_pp4_dp2,
    llama3_8b_fsdp_dp8,
    llama3_8b_128k_tp8_cp8,
    llama3_70b_tp4_pp4_cp2_vpp5_dp2,
)

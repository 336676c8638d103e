"""Mixtral family: Mixtral-8x7B (Llama-3-8B blocks with 8 SwiGLU experts), expert parallel."""

from __future__ import annotations

from recipes.common import large_run_base
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig
from recipes.llama3 import llama3_8b_model


def mixtral_8x7b_model() -> ModelConfig:
    """Mixtral-8x7B shape: Llama-3-8B's blocks with 8 SwiGLU experts (top-2), 32k vocab."""
    model = llama3_8b_model()
    model.seq_length = 4096
    model.vocab_size = 32_000
    model.rotary_base = 1_000_000
    model.num_moe_experts = 8
    model.moe_router_topk = 2
    model.moe_token_dispatcher = "alltoall"
    model.moe_aux_loss_coeff = 0.01
    return model  # add_bias_linear stays False: the local MoE spec fails with linear biases


def mixtral_8x7b_tp1_pp4_ep8_dp16() -> RunConfig:
    """Mixtral-8x7B MoE on 64 GPUs: PP4 (8 layers per stage) x DP16, experts split EP8."""
    cfg = large_run_base(mixtral_8x7b_model(), lr=1e-4)
    cfg.parallel = ParallelConfig(pipeline=4, expert=8)
    cfg.train.global_batch_size = 256  # 16 micro-batches per DP rank
    return cfg


RECIPES = (mixtral_8x7b_tp1_pp4_ep8_dp16,)

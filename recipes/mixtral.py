"""Mixtral family: Mixtral-8x7B (Llama-3-8B blocks with 8 SwiGLU experts), expert parallel.

The tiny Mixtral-shaped recipes share `tiny_base`'s 4-layer byte-level GPT and batch, with every
MLP replaced by 4 SwiGLU experts (top-2) and the load-balancing loss on, so their losses are
comparable layout to layout; `mixtral_tiny_ep1` on one rank is the reference the MoE
equivalence tests (tests/dist/test_moe_equivalence.py) hold the others to.
"""

from __future__ import annotations

from recipes.base_64gpu import large_run_base
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig
from recipes.llama3 import llama3_8b_model
from recipes.tiny import tiny_base


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
    # GPU fast paths as Megatron Bridge's Mixtral provider (NVIDIA-NeMo/Megatron-Bridge@f34e453:
    # src/megatron/bridge/models/mixtral/mixtral_provider.py:80-83): grouped-GEMM experts,
    # fused permutation, no shared experts to overlap.
    model.moe_grouped_gemm = True
    model.moe_permute_fusion = True
    return model  # add_bias_linear stays False: the local MoE spec fails with linear biases


def mixtral_8x7b_tp1_pp4_ep8_dp16() -> RunConfig:
    """Mixtral-8x7B MoE on 64 GPUs: PP4 (8 layers per stage) x DP16, experts split EP8.

    Mistral AI published no pretraining settings. The learning rate is Megatron Bridge's Mixtral
    recipe's, 3e-4 decaying to 3e-5 (NVIDIA-NeMo/Megatron-Bridge@f34e453:src/megatron/bridge/
    recipes/mixtral/mixtral.py:198-199), as is the sequence length (:197, 4,096). The
    load-balancing loss (0.01) is on: Bridge's provider has the same coefficient but balancing
    type "none" (mixtral_provider.py:75-77), which applies none; a model trained from scratch
    here balances its experts. The rest is `large_run_base`'s."""
    cfg = large_run_base(mixtral_8x7b_model(), lr=3e-4)
    cfg.parallel = ParallelConfig(pipeline=4, expert=8)
    cfg.train.global_batch_size = 256  # 16 micro-batches per DP rank
    # Selective recompute of the attention core, as Megatron Bridge's Mixtral recipe (NVIDIA-NeMo/
    # Megatron-Bridge@f34e453:src/megatron/bridge/recipes/mixtral/mixtral.py:276-281, Megatron's
    # default module list).
    cfg.train.recompute = "selective"
    return cfg


def mixtral_tiny_base(ranks: int = 1) -> RunConfig:
    """`tiny_base` with Mixtral's MoE blocks: 4 SwiGLU experts of width 128, top-2, RMSNorm."""
    cfg = tiny_base(ranks)
    m = cfg.model
    m.ffn_hidden_size = 128
    m.activation = "swiglu"
    m.normalization = "RMSNorm"
    m.add_bias_linear = False  # the local MoE spec fails with linear biases
    m.num_moe_experts = 4
    m.moe_router_topk = 2
    m.moe_token_dispatcher = "alltoall"
    m.moe_aux_loss_coeff = 0.01
    return cfg


def mixtral_tiny_ep1() -> RunConfig:
    """Tiny Mixtral-shaped MoE (4 experts, top-2) on one rank: the reference for EP layouts."""
    return mixtral_tiny_base(ranks=1)


def mixtral_tiny_ep2_dp2() -> RunConfig:
    """Tiny Mixtral-shaped MoE, experts split over 2 ranks (EP2 x DP2, alltoall dispatcher)."""
    cfg = mixtral_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(expert=2)
    return cfg


def mixtral_tiny_ep4_dp4() -> RunConfig:
    """Tiny Mixtral-shaped MoE, one expert per rank on 4 ranks (EP4 x DP4, alltoall)."""
    cfg = mixtral_tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(expert=4)
    return cfg


def mixtral_tiny_tp2_sp_ep2_dp2() -> RunConfig:
    """Tiny Mixtral-shaped MoE on 4 ranks: TP2 + sequence parallel x DP2, experts EP2."""
    cfg = mixtral_tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True, expert=2)
    return cfg


def mixtral_tiny_pp2_ep2_dp2() -> RunConfig:
    """Tiny Mixtral-shaped MoE on 4 ranks: 2 pipeline stages x DP2, experts EP2."""
    cfg = mixtral_tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(pipeline=2, expert=2)
    return cfg


RECIPES = (
    mixtral_8x7b_tp1_pp4_ep8_dp16,
    mixtral_tiny_ep1,
    mixtral_tiny_ep2_dp2,
    mixtral_tiny_ep4_dp4,
    mixtral_tiny_tp2_sp_ep2_dp2,
    mixtral_tiny_pp2_ep2_dp2,
)

"""Recipe functions: each returns a complete `RunConfig`, derived from a base by a few changes.

The first docstring line of a recipe is its description in `recipe=list`. Recipes are listed
in `recipes/registry.py`; defining a function here does not register it.
"""

from __future__ import annotations

from recipes.schema import (
    ClusterConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)

# ---------------------------------------------------------------------------------------------
# Tiny CPU recipes. All share one model and one batch (global 8, micro 2) so that their losses
# are comparable: only the layout differs. The single-rank reference runs 4 micro-batches.
# ---------------------------------------------------------------------------------------------


def tiny_base(ranks: int = 1) -> RunConfig:
    """A 4-layer byte-level GPT that trains in about 2 minutes on 2 CPU cores (300 steps)."""
    return RunConfig(
        model=ModelConfig(
            num_layers=4,
            hidden_size=64,
            ffn_hidden_size=256,
            num_attention_heads=4,
            seq_length=128,
            vocab_size=256,
            make_vocab_size_divisible_by=128,
        ),
        cluster=ClusterConfig(nodes=1, gpus_per_node=ranks),
        train=TrainConfig(
            micro_batch_size=2, global_batch_size=8, train_iters=300, eval_interval=100
        ),
        precision=PrecisionConfig(dtype="fp32"),
        logging=LoggingConfig(log_interval=25),
    )


def tiny_dp1() -> RunConfig:
    """Tiny GPT on one rank: the reference every tiny layout must match."""
    return tiny_base(ranks=1)


def tiny_dp1_recompute() -> RunConfig:
    """Tiny GPT on one rank with full activation recomputation (same losses as tiny_dp1)."""
    cfg = tiny_base(ranks=1)
    cfg.train.recompute = "full"
    return cfg


def tiny_dp2() -> RunConfig:
    """Tiny GPT, 2 data-parallel ranks with plain DDP."""
    return tiny_base(ranks=2)


def tiny_dp2_distopt() -> RunConfig:
    """Tiny GPT, 2 data-parallel ranks with the distributed optimizer (ZeRO-1)."""
    cfg = tiny_base(ranks=2)
    cfg.optimizer.distributed = True
    return cfg


def tiny_tp2() -> RunConfig:
    """Tiny GPT, tensor parallel over 2 ranks."""
    cfg = tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(tensor=2)
    return cfg


def tiny_tp2_sp() -> RunConfig:
    """Tiny GPT, tensor parallel over 2 ranks with sequence parallel."""
    cfg = tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True)
    return cfg


def tiny_pp2() -> RunConfig:
    """Tiny GPT, 2 pipeline stages (1F1B), 2 layers each."""
    cfg = tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(pipeline=2)
    return cfg


def tiny_pp2_vpp2() -> RunConfig:
    """Tiny GPT, 2 pipeline stages x 2 virtual stages (interleaved 1F1B), 1 layer per chunk."""
    cfg = tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(pipeline=2, virtual_pipeline=2)
    return cfg


def tiny_tp2_pp2() -> RunConfig:
    """Tiny GPT on 4 CPU ranks, TP2 x PP2: the default recipe."""
    cfg = tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(tensor=2, pipeline=2)
    return cfg


def tiny_tp2_sp_dp2_distopt() -> RunConfig:
    """Tiny GPT on 4 ranks, TP2 + sequence parallel x DP2 with the distributed optimizer."""
    cfg = tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True)
    cfg.optimizer.distributed = True
    return cfg


def tiny_pp2_dp2_overlap() -> RunConfig:
    """Tiny GPT on 4 ranks, PP2 x DP2, distributed optimizer overlapping the grad reduce."""
    cfg = tiny_base(ranks=4)
    cfg.parallel = ParallelConfig(pipeline=2)
    cfg.optimizer.distributed = True
    cfg.optimizer.overlap_grad_reduce = True
    return cfg


# ---------------------------------------------------------------------------------------------
# 64-GPU recipes (8 nodes x 8 GPUs, bf16, distributed optimizer with overlapped communication).
# ---------------------------------------------------------------------------------------------


def large_run_base(model: ModelConfig, lr: float) -> RunConfig:
    """Settings shared by the 64-GPU recipes; each recipe sets the layout and batch."""
    return RunConfig(
        model=model,
        cluster=ClusterConfig(nodes=8, gpus_per_node=8, gpu_memory_gib=80.0),
        train=TrainConfig(
            micro_batch_size=1,
            global_batch_size=128,
            train_iters=50_000,
            eval_interval=1000,
            eval_iters=10,
        ),
        optimizer=OptimizerConfig(
            lr=lr,
            min_lr=lr / 10,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-8,
            clip_grad=1.0,
            distributed=True,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
        ),
        scheduler=SchedulerConfig(style="cosine", warmup_iters=2000),
        precision=PrecisionConfig(dtype="bf16"),
    )


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


def llama3_8b_base() -> RunConfig:
    """Llama-3-8B on 8 x 8 GPUs; layout and batch are left to the recipe."""
    return large_run_base(llama3_8b_model(), lr=3e-4)


def llama3_8b_tp8_dp8() -> RunConfig:
    """Llama-3-8B, config A: TP8 inside each node x 8 data-parallel replicas (64 GPUs)."""
    cfg = llama3_8b_base()
    cfg.parallel = ParallelConfig(tensor=8, sequence_parallel=True)
    # Domain text: 2 sequences per replica, 8 accumulation steps -> 2 x 8 x 8 = 128.
    cfg.train.micro_batch_size = 2
    cfg.train.global_batch_size = 128
    return cfg


def llama3_8b_tp8_pp4_dp2() -> RunConfig:
    """Llama-3-8B, config B: TP8 x PP4 (one node per stage, 8 layers each) x DP2 (64 GPUs)."""
    cfg = llama3_8b_base()
    cfg.parallel = ParallelConfig(tensor=8, pipeline=4, sequence_parallel=True)
    # Domain text: same micro-batch and accumulation as config A -> 2 x 2 x 8 = 32; compare
    # with config A at equal batch via train.global_batch_size=128 (32 accumulation steps).
    cfg.train.micro_batch_size = 2
    cfg.train.global_batch_size = 32
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
    """Llama-3-70B on 64 GPUs: TP4 + SP x PP4 interleaved (5 chunks of 4 layers) x CP2 x DP2."""
    cfg = large_run_base(llama3_70b_model(), lr=1.5e-4)
    cfg.parallel = ParallelConfig(
        tensor=4, pipeline=4, virtual_pipeline=5, context=2, sequence_parallel=True
    )
    cfg.train.global_batch_size = 128  # 64 micro-batches per step: divisible by PP4
    return cfg


def nemotron4_15b_model() -> ModelConfig:
    """Nemotron-4-15B shape: GQA 48/8, squared-ReLU MLP, LayerNorm, no bias, untied, 256k vocab."""
    return ModelConfig(
        num_layers=32,
        hidden_size=6144,
        ffn_hidden_size=24576,
        num_attention_heads=48,
        num_query_groups=8,
        seq_length=4096,
        vocab_size=256_000,
        activation="squared_relu",
        normalization="LayerNorm",
        position_embedding="rope",
        rotary_base=10_000,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        init_method_std=0.0134,
    )


def nemotron4_15b_tp8_pp2_dp4() -> RunConfig:
    """Nemotron-4-15B on 64 GPUs: TP8 + SP in a node x PP2 (16 layers per stage) x DP4."""
    cfg = large_run_base(nemotron4_15b_model(), lr=4.5e-4)
    cfg.parallel = ParallelConfig(tensor=8, pipeline=2, sequence_parallel=True)
    cfg.train.global_batch_size = 384  # Nemotron-4's starting batch: 1.5M tokens at 4k
    return cfg


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

"""Tiny CPU recipes: one 4-layer byte-level GPT in every layout the equivalence tests compare.

All share one model and one batch (global 8, micro 2), so their losses are comparable: only the
layout differs. The single-rank reference runs 4 micro-batches per step.
"""

from __future__ import annotations

from recipes.config.schema import (
    ClusterConfig,
    LoggingConfig,
    ModelConfig,
    ParallelConfig,
    PhaseConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)


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


def tiny_dp2_fsdp() -> RunConfig:
    """Tiny GPT, 2 data-parallel ranks under Megatron FSDP: weights, gradients and optimizer
    state sharded (optim_grads_params, ZeRO-3); fsdp_dtensor checkpoints."""
    cfg = tiny_dp2_distopt()
    cfg.optimizer.fsdp = "optim_grads_params"
    return cfg


def tiny_dp2_bf16_offload() -> RunConfig:
    """Tiny GPT, 2 data-parallel ranks, bf16, the distributed optimizer's state (FP32 master,
    Adam moments) stepped in CPU memory by Megatron's hybrid-device optimizer."""
    cfg = tiny_dp2_distopt()
    cfg.precision = PrecisionConfig(dtype="bf16")
    cfg.optimizer.cpu_offload = True
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


def tiny_cp(context: int, ranks: int, **parallel) -> RunConfig:
    """Tiny GPT with each sequence split over `context` CP ranks (load-balanced chunks)."""
    cfg = tiny_base(ranks=ranks)
    cfg.parallel = ParallelConfig(context=context, **parallel)
    return cfg


def tiny_cp2() -> RunConfig:
    """Tiny GPT, context parallel over 2 ranks: each holds 2 of the sequence's 4 chunks."""
    return tiny_cp(2, ranks=2)


def tiny_cp4() -> RunConfig:
    """Tiny GPT, context parallel over 4 ranks (8 chunks of 16 tokens)."""
    return tiny_cp(4, ranks=4)


def tiny_cp2_tp2_sp() -> RunConfig:
    """Tiny GPT on 4 ranks, CP2 x TP2 with sequence parallel."""
    return tiny_cp(2, ranks=4, tensor=2, sequence_parallel=True)


def tiny_cp2_pp2_distopt() -> RunConfig:
    """Tiny GPT on 4 ranks, CP2 x PP2 with the distributed optimizer (sharded over DP x CP)."""
    cfg = tiny_cp(2, ranks=4, pipeline=2)
    cfg.optimizer.distributed = True
    return cfg


def stdlib_bpe_tp2_pp2() -> RunConfig:
    """The default run: the tiny GPT, TP2 x PP2 on 4 CPU ranks, on the Python standard library
    prepared once (data_cache/) with a locally trained 2048-token BPE."""
    cfg = tiny_tp2_pp2()
    cfg.model.vocab_size = 2048
    cfg.data.source = "blend"
    cfg.data.blend = "conf/data/python_stdlib.yaml"
    return cfg


def stdlib_then_docs_dp1() -> RunConfig:
    """Two phases on one CPU rank: the standard library (BPE as the default run), then this
    project's docs with 30% of the standard library kept, WSD decaying over the second phase."""
    cfg = tiny_dp1()
    cfg.model.vocab_size = 2048
    cfg.data.source = "blend"
    cfg.data.blend = "conf/data/python_stdlib.yaml"
    cfg.train.train_iters = 200
    cfg.scheduler.style = "wsd"
    cfg.phases = [
        PhaseConfig(name="stdlib", tokens=0.7),
        PhaseConfig(name="docs", tokens=0.3, blend="conf/data/stdlib_then_docs.yaml",
                    lr_decay=True),
    ]
    return cfg


# Registered in this order; the first is the default recipe.
RECIPES = (
    stdlib_bpe_tp2_pp2,
    tiny_tp2_pp2,
    tiny_dp1,
    tiny_dp1_recompute,
    stdlib_then_docs_dp1,
    tiny_dp2,
    tiny_dp2_distopt,
    tiny_dp2_fsdp,
    tiny_dp2_bf16_offload,
    tiny_tp2,
    tiny_tp2_sp,
    tiny_pp2,
    tiny_pp2_vpp2,
    tiny_tp2_sp_dp2_distopt,
    tiny_pp2_dp2_overlap,
    tiny_cp2,
    tiny_cp4,
    tiny_cp2_tp2_sp,
    tiny_cp2_pp2_distopt,
)

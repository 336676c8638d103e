"""Llama 3.1 405B in the three pretraining layouts the Llama 3 paper reports (Table 4).

126 layers over 16 pipeline stages: the first and last stage hold one layer fewer (7) than the
middle ones (8), which leaves room for the embedding and the output layer and loss
(`parallel.first_stage_layers` / `last_stage_layers`, Megatron's
num_layers_in_first/last_pipeline_stage). The uneven ends rule out interleaving here (Megatron
needs them divisible by the virtual stages), so the schedule is 1F1B. Each step is 16M tokens:
2,048 sequences of 8,192, or 128 of 131,072 for long-context training.

The learning rate is the paper's for the 405B (The Llama 3 Herd of Models, arXiv 2407.21783,
section 3.4.1): peak 8e-5 after a linear warm-up of 8,000 steps, cosine decay to 8e-7. The
paper decays over 1,200,000 steps; these recipes run `large_run_base`'s 50,000, and its
weight decay, Adam settings and clipping, which the paper does not give.
"""

from __future__ import annotations

import dataclasses

from recipes.base_64gpu import large_run_base
from recipes.config.schema import ClusterConfig, ModelConfig, ParallelConfig, RunConfig
from recipes.llama3 import llama3_8b_model


def llama31_405b_model() -> ModelConfig:
    """Llama-3.1-405B shape: the Llama 3 family at 126 layers, width 16,384, GQA 128/8, SwiGLU
    53,248, with Llama 3.1's RoPE scaling (factor 8)."""
    return dataclasses.replace(
        llama3_8b_model(), num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
        num_attention_heads=128, rope_scaling_factor=8.0,
    )


def _llama31_405b(nodes: int, context: int, seq_length: int, global_batch: int) -> RunConfig:
    cfg = large_run_base(llama31_405b_model(), lr=8e-5)
    cfg.model.seq_length = seq_length
    cfg.cluster = ClusterConfig(nodes=nodes, gpus_per_node=8, gpu_memory_gib=80.0)
    # TP communication overlap as Megatron Bridge's 405B recipe (NVIDIA-NeMo/Megatron-Bridge@
    # 38b4a06:src/megatron/bridge/recipes/llama/llama3.py:1201-1205).
    cfg.parallel = ParallelConfig(tensor=8, pipeline=16, context=context,
                                  sequence_parallel=True, first_stage_layers=7,
                                  last_stage_layers=7, tp_comm_overlap=True)
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = global_batch
    cfg.scheduler.warmup_iters = 8000
    cfg.optimizer.min_lr = 8e-7
    return cfg


def llama31_405b_tp8_pp16_dp64() -> RunConfig:
    """Llama-3.1-405B on 8,192 GPUs: TP8 x PP16 (7/8.../7 layers) x DP64, 2,048 x 8k per step."""
    return _llama31_405b(nodes=1024, context=1, seq_length=8192, global_batch=2048)


def llama31_405b_tp8_pp16_dp128() -> RunConfig:
    """Llama-3.1-405B on 16,384 GPUs: TP8 x PP16 (7/8.../7 layers) x DP128, 2,048 x 8k."""
    return _llama31_405b(nodes=2048, context=1, seq_length=8192, global_batch=2048)


def llama31_405b_128k_tp8_cp16_pp16_dp8() -> RunConfig:
    """Llama-3.1-405B at 128k on 16,384 GPUs: TP8 x CP16 x PP16 x DP8, 128 x 128k per step."""
    return _llama31_405b(nodes=2048, context=16, seq_length=131_072, global_batch=128)


RECIPES = (
    llama31_405b_tp8_pp16_dp64,
    llama31_405b_tp8_pp16_dp128,
    llama31_405b_128k_tp8_cp16_pp16_dp8,
)

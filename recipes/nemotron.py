"""Nemotron-4 family: the 15B shape (squared-ReLU MLP, 256k vocabulary) on 64 GPUs."""

from __future__ import annotations

from recipes.base_64gpu import large_run_base
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig


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


RECIPES = (nemotron4_15b_tp8_pp2_dp4,)

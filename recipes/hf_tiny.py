"""Tiny Llama-, Mixtral- and NemotronH-shaped recipes for the HF interop tests (CPU, fp32).

Each has every feature a published model's mapping touches, at a size a 2-core CPU converts and
runs in seconds: GQA (4 query heads in 2 groups), SwiGLU, RMSNorm, RoPE with a base (Llama: 3.1's
scaling too), a vocabulary of 300 (at least the byte tokenizer's 256) that Megatron pads to 320
at TP1 and TP2 alike (padding unit 160 x TP; added on import, removed on export), untied (Llama)
and tied (Mixtral) embeddings, and Mixtral's router with 4 experts (top-2). The NemotronH one is
a hybrid with one layer of each kind (Mamba2, attention, squared-ReLU MLP, MoE routed the
Nemotron 3 way); the Nemotron 3 Super-shaped one adds a latent MoE and an MTP depth of an
attention and a latent-MoE layer, stored once and run twice, as Super does. Layouts are
overrides (`parallel.*`, `cluster.gpus_per_node`).
"""

from __future__ import annotations

from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig
from recipes.nemotron.nemotron_h import nemotron3_moe, nemotron_h_model
from recipes.tiny import tiny_base


def hf_tiny_llama_model() -> ModelConfig:
    """4 layers (PP2 x VPP2 holds one per chunk) of width 64, GQA 4/2, SwiGLU 128, RMSNorm, RoPE
    500k with x8 scaling, untied."""
    return ModelConfig(
        num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        num_query_groups=2, seq_length=32, vocab_size=300, make_vocab_size_divisible_by=160,
        activation="swiglu", normalization="RMSNorm", position_embedding="rope",
        rotary_base=500_000, rope_scaling_factor=8.0, add_bias_linear=False,
        share_embeddings_and_output_weights=False,
    )


def _on(model: ModelConfig, ranks: int, parallel: ParallelConfig | None = None) -> RunConfig:
    cfg = tiny_base(ranks)
    cfg.model = model
    cfg.parallel = parallel or ParallelConfig()
    cfg.train.global_batch_size = 4  # 2 micro-batches of 2 on one rank
    cfg.data.source = "synthetic"
    return cfg


def hf_tiny_llama() -> RunConfig:
    """Tiny Llama-3-shaped model (GQA, SwiGLU, RMSNorm, scaled RoPE, untied) on one rank."""
    return _on(hf_tiny_llama_model(), ranks=1)


def hf_tiny_mixtral_model() -> ModelConfig:
    """2 of the tiny Llama's blocks with 4 SwiGLU experts (top-2), RoPE 1M unscaled, tied."""
    model = hf_tiny_llama_model()
    model.num_layers = 2
    model.rotary_base = 1_000_000
    model.rope_scaling_factor = None
    model.share_embeddings_and_output_weights = True
    model.num_moe_experts = 4
    model.moe_router_topk = 2
    return model


def hf_tiny_mixtral() -> RunConfig:
    """Tiny Mixtral-shaped MoE (4 experts, top-2, tied embeddings) on one rank."""
    cfg = _on(hf_tiny_mixtral_model(), ranks=1)
    return cfg


def hf_tiny_nemotron_h_model() -> ModelConfig:
    """4 layers (M * - E) of width 32: Mamba 8 heads x 8 in 2 groups with state 16, GQA 4/2,
    a squared-ReLU MLP of 64, 4 routed experts of 32 (top-2, sigmoid with expert bias, x2.5)
    beside a shared expert of 48; the byte vocabulary (256) padded to 320 at TP1 and TP2;
    untied."""
    model = nemotron_h_model("M*-E", 32, 64, 4, num_query_groups=2, seq_length=32,
                             vocab_size=256, make_vocab_size_divisible_by=160, mamba_num_heads=8,
                             mamba_head_dim=8, mamba_num_groups=2, mamba_state_dim=16,
                             mamba_chunk_size=8)
    return nemotron3_moe(model, experts=4, topk=2, width=32, shared=48, scaling=2.5)


def hf_tiny_nemotron_h() -> RunConfig:
    """Tiny NemotronH-shaped hybrid (Mamba2, attention, MLP, Nemotron 3 MoE) on one rank."""
    cfg = _on(hf_tiny_nemotron_h_model(), ranks=1)
    return cfg


def hf_tiny_nemotron_super() -> RunConfig:
    """Tiny Nemotron 3 Super-shaped hybrid on one rank: the NemotronH one's layers with its
    experts in a latent width of 16, then two MTP depths of attention + latent MoE sharing one
    set of weights (M*-E/*E/*E)."""
    model = hf_tiny_nemotron_h_model()
    model.hybrid_layer_pattern += "/*E/*E"
    model.moe_latent_size = 16
    model.mtp_use_repeated_layer = True
    model.mtp_loss_scaling_factor = 0.3
    return _on(model, ranks=1)


RECIPES = (hf_tiny_llama, hf_tiny_mixtral, hf_tiny_nemotron_h, hf_tiny_nemotron_super)

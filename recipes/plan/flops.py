"""Model FLOPs: the one definition of the work a model needs, used by the planner (step time,
GPU-hours), the trainer (model TFLOP/s per GPU, MFU) and the scaling harness.

Counted: matrix multiplies, 2·m·k·n for an [m, k] x [k, n] product, forward and backward (the
backward is twice the forward: data and weight gradients). Per layer, its token mixer and its
MLP are counted by kind:

- attention: Q (heads x kv_channels wide) and K, V (query groups x kv_channels wide: GQA), the
  output projection, and the scores QK^T and softmax(QK^T)V over the positions each token
  attends to, half the sequence under the causal mask;
- dense MLP: two matrices, three with a gated unit (SwiGLU's gate and up);
- MoE: the routed experts a token runs (top-k of them, not all) plus the shared experts; with a
  latent space the routed experts run at the latent width, and its two projections count;
- Mamba2 (hybrid models): the in and out projections, and the SSD scan's products: inside a
  chunk of Q tokens, C·Bᵀ per group and its mix of x (half of each chunk's square, causal),
  and between chunks each token's x·Bᵀ into the state and C·state out of it;
- then the logits over the padded vocabulary;
- multi-token prediction (hybrid models, the pattern's depths after `/`): every depth runs its
  layers (counted by kind, as the decoder's), its projection of the embedding and the hidden
  state (2·hidden -> hidden) and the logits once more; a depth sharing its weights with the
  others still runs, so it counts.

Not counted (as in Megatron-LM's `num_floating_point_operations`, which gives the same number
where both apply: tests/unit/test_flops.py): the router, norms, element-wise work, embedding
lookups, and activation recomputation, which is extra work, not useful work, so it never raises
the figure. A hybrid model's layers are counted by kind from its pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.models import kinds
from recipes.models.gpt.flops import (
    attention_projection_flops,
    attention_score_flops,
    logits_flops,
    mlp_flops,
)
from recipes.models.hybrid import pattern as hybrid
from recipes.models.hybrid.flops import mamba_flops, mtp_projection_flops
from recipes.models.moe.flops import moe_flops

# Forward + backward: the backward computes the data and the weight gradient of every product.
TRAINING_PASSES = 3


@dataclass(frozen=True)
class FlopsShape:
    """The model dimensions the FLOPs definition needs, with the layers counted by kind."""

    hidden_size: int
    padded_vocab_size: int
    attention_layers: int  # layers whose token mixer is self-attention
    dense_mlp_layers: int  # layers with one dense MLP
    moe_layers: int  # layers with a mixture-of-experts MLP
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    gated: bool  # a gated linear unit (SwiGLU): three MLP matrices instead of two
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0  # one routed expert's width
    moe_shared_ffn_hidden_size: int = 0  # the shared experts' width together (0: none)
    mamba_layers: int = 0  # Mamba2 mixer layers (hybrid models)
    mamba_inner: int = 0  # Mamba heads x head width (d_inner)
    mamba_heads: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0  # SSM state per group
    mamba_chunk: int = 0  # SSD scan chunk length
    moe_latent_size: int = 0  # the width routed experts run at (0: the model's)
    mtp_depths: int = 0  # MTP depths (their layers are in the counts above)

    @classmethod
    def from_config(cls, cfg: Any) -> FlopsShape:
        """The shape of a run config's model: a GPT model's every layer attention, then MLP or
        MoE; a hybrid model's layers by the kinds its pattern names."""
        m = cfg.model
        moe = m.num_moe_experts is not None
        if m.is_hybrid:
            counts = {symbol: hybrid.count(m, symbol) + hybrid.mtp_count(m, symbol)
                      for symbol in kinds.LAYER_SYMBOLS}
        else:
            counts = {kinds.MAMBA: 0, kinds.ATTENTION: m.num_layers,
                     kinds.MLP: 0 if moe else m.num_layers, kinds.MOE: m.num_layers if moe else 0}
        mamba = counts[kinds.MAMBA] > 0
        return cls(
            hidden_size=m.hidden_size,
            padded_vocab_size=cfg.layout.padded_vocab,
            attention_layers=counts[kinds.ATTENTION],
            dense_mlp_layers=counts[kinds.MLP],
            moe_layers=counts[kinds.MOE],
            mamba_layers=counts[kinds.MAMBA],
            mamba_inner=hybrid.mamba_heads(m) * m.mamba_head_dim if mamba else 0,
            mamba_heads=hybrid.mamba_heads(m) if mamba else 0,
            mamba_groups=m.mamba_num_groups if mamba else 0,
            mamba_state=m.mamba_state_dim if mamba else 0,
            mamba_chunk=m.mamba_chunk_size if mamba else 0,
            moe_shared_ffn_hidden_size=(m.moe_shared_expert_ffn_hidden_size or 0) if moe else 0,
            num_attention_heads=m.num_attention_heads,
            num_query_groups=m.num_query_groups or m.num_attention_heads,
            kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
            ffn_hidden_size=m.ffn_hidden_size,
            gated=m.activation == "swiglu",
            moe_router_topk=m.moe_router_topk if moe else 0,
            moe_ffn_hidden_size=(m.moe_ffn_hidden_size or m.ffn_hidden_size) if moe else 0,
            moe_latent_size=(m.moe_latent_size or 0) if moe else 0,
            mtp_depths=hybrid.mtp_depths(m.hybrid_layer_pattern),
        )


def forward_flops_per_token(s: FlopsShape) -> float:
    """Forward FLOPs of one token that do not depend on the sequence: every layer's mixer
    projections and MLP (the MTP depths' too), each MTP depth's projection, then the logits
    (once more per MTP depth)."""
    return (s.attention_layers * attention_projection_flops(s)
            + s.mamba_layers * mamba_flops(s)
            + s.dense_mlp_layers * mlp_flops(s, s.ffn_hidden_size)
            + s.moe_layers * moe_flops(s)
            + s.mtp_depths * mtp_projection_flops(s)
            + (1 + s.mtp_depths) * logits_flops(s))


def training_flops(s: FlopsShape, tokens: int, seqlen_squared_sum: int) -> float:
    """Useful FLOPs of training on `tokens` positions whose sequences' squared lengths sum to
    `seqlen_squared_sum` (one full row of n tokens: n and n²; a packed row: each document's)."""
    pairs = seqlen_squared_sum / 2  # the causal mask keeps half of each sequence's square
    return TRAINING_PASSES * (tokens * forward_flops_per_token(s)
                              + attention_score_flops(s, pairs))


def training_flops_per_token(s: FlopsShape, seq_length: int) -> float:
    """Useful FLOPs per token of training on full causal rows of `seq_length` tokens: on
    average a token attends to half its row."""
    return TRAINING_PASSES * (forward_flops_per_token(s) + attention_score_flops(s, seq_length / 2))


def model_flops_per_token(cfg: Any) -> float:
    """Training FLOPs per token of a run config's model at its sequence length."""
    return training_flops_per_token(FlopsShape.from_config(cfg), cfg.model.seq_length)


def step_flops(cfg: Any) -> float:
    """Useful FLOPs of one global batch of the run (every row a full causal sequence)."""
    return model_flops_per_token(cfg) * cfg.train.global_batch_size * cfg.model.seq_length


def tflops_per_gpu(flops: float, seconds: float, gpus: int) -> float:
    return flops / seconds / gpus / 1e12 if seconds > 0 else 0.0


def model_flops_utilisation(tflops: float, peak_tflops: float | None) -> float | None:
    """Achieved over peak; None when no peak is known (never a guessed peak)."""
    if not peak_tflops:
        return None
    return tflops / peak_tflops

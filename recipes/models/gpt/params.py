"""The GPT family's parameter terms on one rank, exactly as Megatron Core builds them: attention
(QKV, projection, biases, its norm), the dense MLP (two matrices, fc1 twice as wide when gated),
the input embedding and the final norm with the output layer (a tied copy on the last stage).
Every family's model has the embedding and the output head; hybrid models also have these
attention and MLP layers.
"""

from __future__ import annotations

from typing import Any

from recipes.models.counts import ParamCount


def attention_params(m: Any, tp: int) -> ParamCount:
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value, h = heads * width, 2 * groups * width, m.hidden_size
    bias = int(m.add_bias_linear)
    split = ((query + key_value) * h + (query + key_value) * bias + h * query) // tp
    return ParamCount(tp_split=split, replicated=h * bias + norm_params(m))


def norm_params(m: Any) -> int:
    return m.hidden_size * (2 if m.normalization == "LayerNorm" else 1)


def mlp_width(m: Any, ffn: int) -> int:
    """Rows of the first MLP weight: gated units (SwiGLU) stack two projections."""
    return ffn * (2 if m.activation == "swiglu" else 1)


def dense_mlp_params(m: Any, tp: int) -> ParamCount:
    h, f, bias = m.hidden_size, m.ffn_hidden_size, int(m.add_bias_linear)
    fc1 = mlp_width(m, f) * (h + bias)
    split = (fc1 + h * f) // tp
    return ParamCount(tp_split=split, replicated=h * bias + norm_params(m))


def embedding_params(cfg: Any) -> ParamCount:
    """Input embedding (first chunk of the first stage): vocabulary split over TP."""
    m, layout = cfg.model, cfg.layout
    words = layout.padded_vocab * m.hidden_size // layout.tensor
    positions = m.seq_length * m.hidden_size if m.position_embedding == "learned_absolute" else 0
    return ParamCount(tp_split=words, replicated=positions)


def output_params(cfg: Any) -> ParamCount:
    """Final norm and output layer (last chunk of the last stage). Tied weights need no output
    layer on a single stage; with pipelining the last stage holds a copy of the embedding."""
    m, layout = cfg.model, cfg.layout
    logits = layout.padded_vocab * m.hidden_size // layout.tensor
    tied = m.share_embeddings_and_output_weights
    if tied and layout.pipeline == 1:
        return ParamCount(replicated=norm_params(m))
    return ParamCount(tp_split=logits, replicated=norm_params(m), tied_copy=logits if tied else 0)


# GEMM weights alone (no biases, norms): what Transformer Engine's linears hold and FP8
# parameters store in FP8 (`plugins/fp8`).

def attention_gemm_weights(m: Any, tp: int) -> ParamCount:
    """QKV and output-projection weights of one attention layer on one rank."""
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    width = m.kv_channels or m.hidden_size // heads
    query, key_value = heads * width, 2 * groups * width
    return ParamCount(tp_split=((query + key_value) * m.hidden_size + m.hidden_size * query) // tp)


def dense_mlp_gemm_weights(m: Any, tp: int) -> ParamCount:
    """The two MLP weights on one rank."""
    h, f = m.hidden_size, m.ffn_hidden_size
    return ParamCount(tp_split=(mlp_width(m, f) * h + h * f) // tp)

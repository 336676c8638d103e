"""Tensor names and layouts, Hugging Face <-> Megatron Core: Llama 3, Mixtral, NemotronH.

Why: the two formats store the same weights under different names and, for three of them, in a
different layout. Megatron's side is named here by the model's own state-dict names on one rank
(TP1 x PP1 x EP1: layer and expert numbers are then global), the names its sharded state dict
is built from, so the TP/PP/EP split is Megatron's business, not ours.

- Attention: Megatron fuses Q, K and V into `linear_qkv` with the rows of each query group
  together, [the group's q heads; its k head; its v head] per group, so a TP split along rows
  keeps whole groups on a rank (`transformer/attention.py`, `get_query_key_value_tensors`).
  Hugging Face keeps `q_proj`, `k_proj`, `v_proj` apart, heads in order.
- SwiGLU: Megatron fuses gate and up into `linear_fc1` as [gate; up]; in a TP run each rank
  holds [its gate rows; its up rows] and the sharded state dict stores the global [gate; up]
  (`apply_swiglu_sharded_factory`). Mixtral's experts: w1 = gate, w3 = up, w2 = down.
- Vocabulary: Megatron pads the embedding and output rows to a multiple of
  `make_vocab_size_divisible_by` x TP; import adds zero rows, export removes them.
- NemotronH (Nemotron-H, Nemotron Nano v2, Nemotron 3; Megatron's `HybridModel`): one rule set
  per layer kind of the pattern. Every tensor but QKV and the vocabulary is a plain copy: the
  Mamba mixer's `in_proj` rows are [z; x; B; C; dt] and `conv1d` rows [x; B; C] on both sides
  (Megatron's sharded state dict splits them per part for TP, `ssm/mamba_mixer.py:1418-1485`),
  the MLPs are ungated (squared ReLU: `linear_fc1` is `up_proj`), and the router's expert bias
  is transformers' `e_score_correction_bias`. Hybrid rules carry their Megatron shape.
Every function only reshapes, concatenates or slices: values and dtype pass through unchanged,
so import -> export gives back byte-identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recipes.config.hybrid import layer_symbols, mamba_heads
from recipes.config.schema import ModelConfig


@dataclass(frozen=True)
class HybridShapes:
    """A hybrid model's own sizes: its pattern, MLP widths and the Mamba mixer's."""

    pattern: str  # one symbol per layer, without stage boundaries
    dense_ffn: int  # width of the `-` layers
    moe_ffn: int  # width of one routed expert
    shared_ffn: int | None  # width of the shared expert; None = none
    mamba_heads: int
    mamba_head_dim: int
    mamba_groups: int
    mamba_state: int
    conv_kernel: int

    @property
    def d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:  # x, B and C go through the convolution
        return self.d_inner + 2 * self.mamba_groups * self.mamba_state

    @classmethod
    def of(cls, model: ModelConfig) -> HybridShapes:
        return cls(
            pattern=layer_symbols(model.hybrid_layer_pattern), dense_ffn=model.ffn_hidden_size,
            moe_ffn=model.moe_ffn_hidden_size or model.ffn_hidden_size,
            shared_ffn=model.moe_shared_expert_ffn_hidden_size, mamba_heads=mamba_heads(model),
            mamba_head_dim=model.mamba_head_dim, mamba_groups=model.mamba_num_groups,
            mamba_state=model.mamba_state_dim, conv_kernel=model.mamba_conv_kernel,
        )


@dataclass(frozen=True)
class Shapes:
    """The sizes every mapping needs, from our model config and the padded vocabulary."""

    layers: int
    hidden: int
    heads: int
    groups: int
    head_dim: int
    ffn: int
    vocab: int
    padded_vocab: int
    experts: int | None
    tied: bool
    hybrid: HybridShapes | None = None

    @classmethod
    def of(cls, model: ModelConfig, padded_vocab: int) -> Shapes:
        return cls(
            layers=model.num_layers, hidden=model.hidden_size, heads=model.num_attention_heads,
            groups=model.num_query_groups or model.num_attention_heads,
            head_dim=model.kv_channels or model.hidden_size // model.num_attention_heads,
            ffn=model.moe_ffn_hidden_size or model.ffn_hidden_size, vocab=model.vocab_size,
            padded_vocab=padded_vocab, experts=model.num_moe_experts,
            tied=model.share_embeddings_and_output_weights,
            hybrid=HybridShapes.of(model) if model.is_hybrid else None,
        )


@dataclass(frozen=True)
class Rule:
    """One Megatron tensor and the Hugging Face tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    kind: str  # copy | qkv | gate_up | vocab
    shape: tuple[int, ...] | None = None  # the Megatron shape, where the rule states it


def _layer_rules(i: int, s: Shapes) -> list[Rule]:
    hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
    rules = [
        Rule(mc + "input_layernorm.weight", (hf + "input_layernorm.weight",), "copy"),
        Rule(mc + "self_attention.linear_qkv.weight",
             tuple(f"{hf}self_attn.{p}_proj.weight" for p in "qkv"), "qkv"),
        Rule(mc + "self_attention.linear_proj.weight", (hf + "self_attn.o_proj.weight",), "copy"),
        Rule(mc + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), "copy"),
    ]
    if s.experts is None:
        return rules + [
            Rule(mc + "mlp.linear_fc1.weight",
                 (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"), "gate_up"),
            Rule(mc + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), "copy"),
        ]
    rules.append(Rule(mc + "mlp.router.weight", (hf + "block_sparse_moe.gate.weight",), "copy"))
    for j in range(s.experts):
        expert, ours = f"{hf}block_sparse_moe.experts.{j}.", f"{mc}mlp.experts.local_experts.{j}."
        rules += [
            Rule(ours + "linear_fc1.weight", (expert + "w1.weight", expert + "w3.weight"),
                 "gate_up"),
            Rule(ours + "linear_fc2.weight", (expert + "w2.weight",), "copy"),
        ]
    return rules


def rules(s: Shapes) -> list[Rule]:
    """Every weight of the model, in Hugging Face's file order (embedding, layers, norm, head)."""
    if s.hybrid is not None:
        return _hybrid_rules(s)
    found = [Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in range(s.layers):
        found += _layer_rules(i, s)
    found.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "copy"))
    if not s.tied:
        found.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
    return found


def _copies(hf: str, mc: str, names: dict[str, tuple[str, tuple[int, ...]]]) -> list[Rule]:
    """Plain copies: Megatron name -> (Hugging Face name, shape), under two prefixes."""
    return [Rule(mc + ours, (hf + theirs,), "copy", shape)
            for ours, (theirs, shape) in names.items()]


def _mamba_rules(hf: str, mc: str, s: Shapes, h: HybridShapes) -> list[Rule]:
    in_proj = 2 * h.d_inner + 2 * h.mamba_groups * h.mamba_state + h.mamba_heads
    return _copies(hf, mc, {
        "norm.weight": ("norm.weight", (s.hidden,)),
        "mixer.in_proj.weight": ("mixer.in_proj.weight", (in_proj, s.hidden)),
        "mixer.conv1d_weight": ("mixer.conv1d.weight", (h.conv_dim, 1, h.conv_kernel)),
        "mixer.conv1d_bias": ("mixer.conv1d.bias", (h.conv_dim,)),
        "mixer.dt_bias": ("mixer.dt_bias", (h.mamba_heads,)),
        "mixer.A_log": ("mixer.A_log", (h.mamba_heads,)),
        "mixer.D": ("mixer.D", (h.mamba_heads,)),
        "mixer.norm.weight": ("mixer.norm.weight", (h.d_inner,)),
        "mixer.out_proj.weight": ("mixer.out_proj.weight", (s.hidden, h.d_inner)),
    })


def _attention_rules(hf: str, mc: str, s: Shapes, h: HybridShapes) -> list[Rule]:
    return [
        Rule(mc + "input_layernorm.weight", (hf + "norm.weight",), "copy", (s.hidden,)),
        Rule(mc + "self_attention.linear_qkv.weight",
             tuple(f"{hf}mixer.{p}_proj.weight" for p in "qkv"), "qkv"),
        Rule(mc + "self_attention.linear_proj.weight", (hf + "mixer.o_proj.weight",), "copy",
             (s.hidden, s.heads * s.head_dim)),
    ]


def _mlp_rules(hf: str, mc: str, s: Shapes, h: HybridShapes) -> list[Rule]:
    return _copies(hf, mc, {
        "pre_mlp_layernorm.weight": ("norm.weight", (s.hidden,)),
        "mlp.linear_fc1.weight": ("mixer.up_proj.weight", (h.dense_ffn, s.hidden)),
        "mlp.linear_fc2.weight": ("mixer.down_proj.weight", (s.hidden, h.dense_ffn)),
    })


def _moe_rules(hf: str, mc: str, s: Shapes, h: HybridShapes) -> list[Rule]:
    names = {
        "pre_mlp_layernorm.weight": ("norm.weight", (s.hidden,)),
        "mlp.router.weight": ("mixer.gate.weight", (s.experts, s.hidden)),
        "mlp.router.expert_bias": ("mixer.gate.e_score_correction_bias", (s.experts,)),
    }
    for j in range(s.experts):
        names[f"mlp.experts.local_experts.{j}.linear_fc1.weight"] = (
            f"mixer.experts.{j}.up_proj.weight", (h.moe_ffn, s.hidden))
        names[f"mlp.experts.local_experts.{j}.linear_fc2.weight"] = (
            f"mixer.experts.{j}.down_proj.weight", (s.hidden, h.moe_ffn))
    if h.shared_ffn is not None:
        names["mlp.shared_experts.linear_fc1.weight"] = (
            "mixer.shared_experts.up_proj.weight", (h.shared_ffn, s.hidden))
        names["mlp.shared_experts.linear_fc2.weight"] = (
            "mixer.shared_experts.down_proj.weight", (s.hidden, h.shared_ffn))
    return _copies(hf, mc, names)


HYBRID_LAYER_RULES = {"M": _mamba_rules, "*": _attention_rules, "-": _mlp_rules, "E": _moe_rules}


def _hybrid_rules(s: Shapes) -> list[Rule]:
    """NemotronH as transformers saves it (`backbone.*`, one tensor per expert) <-> HybridModel
    (each layer one block: its norm and its mixer)."""
    found = [Rule("embedding.word_embeddings.weight", ("backbone.embeddings.weight",), "vocab")]
    for i, symbol in enumerate(s.hybrid.pattern):
        found += HYBRID_LAYER_RULES[symbol](f"backbone.layers.{i}.", f"decoder.layers.{i}.",
                                            s, s.hybrid)
    found.append(Rule("decoder.final_norm.weight", ("backbone.norm_f.weight",), "copy",
                      (s.hidden,)))
    if not s.tied:
        found.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
    return found


def hf_shapes(rule: Rule, s: Shapes) -> list[tuple[int, ...]]:
    """The shape each of the rule's Hugging Face tensors must have."""
    megatron = megatron_shape(rule, s)
    if rule.kind == "qkv":
        return [(s.heads * s.head_dim, s.hidden), (s.groups * s.head_dim, s.hidden),
                (s.groups * s.head_dim, s.hidden)]
    if rule.kind == "gate_up":
        return [(s.ffn, s.hidden), (s.ffn, s.hidden)]
    if rule.kind == "vocab":
        return [(s.vocab, s.hidden)]
    return [megatron]


def megatron_shape(rule: Rule, s: Shapes) -> tuple[int, ...]:
    """The shape of the Megatron tensor on one rank (TP1), i.e. its global shape."""
    if rule.shape is not None:
        return rule.shape
    name = rule.megatron
    if rule.kind == "qkv":
        return ((s.heads + 2 * s.groups) * s.head_dim, s.hidden)
    if rule.kind == "gate_up":
        return (2 * s.ffn, s.hidden)
    if rule.kind == "vocab":
        return (s.padded_vocab, s.hidden)
    if name.endswith("layernorm.weight"):
        return (s.hidden,)
    if name.endswith("linear_proj.weight"):
        return (s.hidden, s.heads * s.head_dim)
    if name.endswith("router.weight"):
        return (s.experts, s.hidden)
    return (s.hidden, s.ffn)  # linear_fc2


def _qkv_pack(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shapes) -> torch.Tensor:
    per_group = s.heads // s.groups * s.head_dim
    grouped = (q.reshape(s.groups, per_group, s.hidden),
               k.reshape(s.groups, s.head_dim, s.hidden),
               v.reshape(s.groups, s.head_dim, s.hidden))
    return torch.cat(grouped, dim=1).reshape(-1, s.hidden)


def _qkv_unpack(qkv: torch.Tensor, s: Shapes) -> list[torch.Tensor]:
    per_group = s.heads // s.groups * s.head_dim
    grouped = qkv.reshape(s.groups, per_group + 2 * s.head_dim, s.hidden)
    q, k, v = torch.split(grouped, [per_group, s.head_dim, s.head_dim], dim=1)
    return [part.reshape(-1, s.hidden).contiguous() for part in (q, k, v)]


def to_megatron(rule: Rule, tensors: list[torch.Tensor], s: Shapes) -> torch.Tensor:
    """The Megatron tensor (TP1 layout) from the rule's Hugging Face tensors, dtype kept."""
    if rule.kind == "qkv":
        return _qkv_pack(*tensors, s)
    if rule.kind == "gate_up":
        return torch.cat(tensors, dim=0)
    if rule.kind == "vocab":
        (weight,) = tensors
        padding = weight.new_zeros((s.padded_vocab - s.vocab, s.hidden))
        return torch.cat([weight, padding], dim=0)
    return tensors[0].contiguous()


def to_hf(rule: Rule, tensor: torch.Tensor, s: Shapes) -> list[torch.Tensor]:
    """The rule's Hugging Face tensors from the Megatron tensor (TP1 layout), dtype kept."""
    if rule.kind == "qkv":
        return _qkv_unpack(tensor, s)
    if rule.kind == "gate_up":
        return [part.contiguous() for part in torch.chunk(tensor, 2, dim=0)]
    if rule.kind == "vocab":
        return [tensor[: s.vocab].contiguous()]
    return [tensor.contiguous()]

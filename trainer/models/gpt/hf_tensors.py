"""The GPT family's tensors, Hugging Face <-> Megatron Core (Llama 3, Mixtral), and the rule type
and conversions every family's mapping uses.

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
Every function only reshapes, concatenates or slices: values and dtype pass through unchanged,
so import -> export gives back byte-identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recipes.config.schema import ModelConfig


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
    hybrid: Any = None  # a hybrid model's own sizes (`trainer.models.hybrid.hf_tensors`)

    @classmethod
    def of(cls, model: ModelConfig, padded_vocab: int, hybrid: Any = None) -> Shapes:
        return cls(
            layers=model.num_layers, hidden=model.hidden_size, heads=model.num_attention_heads,
            groups=model.num_query_groups or model.num_attention_heads,
            head_dim=model.kv_channels or model.hidden_size // model.num_attention_heads,
            ffn=model.moe_ffn_hidden_size or model.ffn_hidden_size, vocab=model.vocab_size,
            padded_vocab=padded_vocab, experts=model.num_moe_experts,
            tied=model.share_embeddings_and_output_weights, hybrid=hybrid,
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
    """Every weight of a Llama or Mixtral model, in Hugging Face's file order (embedding,
    layers, norm, head)."""
    found = [Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in range(s.layers):
        found += _layer_rules(i, s)
    found.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "copy"))
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

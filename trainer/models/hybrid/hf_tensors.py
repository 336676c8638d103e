"""The hybrid family's tensors, Hugging Face <-> Megatron Core: NemotronH (Nemotron-H, Nemotron Nano
v2, Nemotron 3) <-> `HybridModel`.

One rule set per layer kind of the pattern. Every tensor but QKV and the vocabulary is a plain
copy: the Mamba mixer's `in_proj` rows are [z; x; B; C; dt] and `conv1d` rows [x; B; C] on both
sides (Megatron's sharded state dict splits them per part for TP,
`ssm/mamba_mixer.py:1418-1485`), the MLPs are ungated (squared ReLU: `linear_fc1` is
`up_proj`), and the router's expert bias is transformers' `e_score_correction_bias`. A latent
MoE's experts read and write the latent width, its projections are `fc1_latent_proj` and
`fc2_latent_proj` on both sides. MTP depths: a NemotronH release stores each depth's layers
flat, `mtp.layers.{depth x L + i}` for the depth's L layers, the embedding and hidden-state
norms and the projection with the first and the final norm with the last, while Megatron nests
them (`mtp.layers.{depth}.mtp_model_layer.layers.{i}`); as Megatron Bridge maps them
(Megatron-Bridge@03c781b:src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py,
`_MTPFlatteningMapping`). transformers itself skips `mtp.*` on load (`modeling_nemotron_h.py`,
`_keys_to_ignore_on_load_unexpected`). Hybrid rules carry their Megatron shape; the rule type
and conversions are the GPT family's.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipes.config.schema import ModelConfig
from recipes.models.hybrid.pattern import layer_symbols, mamba_heads, mtp_built, mtp_pattern
from trainer.models.gpt.hf_tensors import Rule, Shapes


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
    latent: int | None = None  # the width routed experts read and write; None = hidden
    mtp_pattern: str = ""  # the layers of one MTP depth
    mtp_built: int = 0  # MTP depths holding weights of their own

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
            latent=model.moe_latent_size, mtp_pattern=mtp_pattern(model.hybrid_layer_pattern),
            mtp_built=mtp_built(model),
        )


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
    width = h.latent or s.hidden  # what a routed expert reads and writes
    if h.latent:
        names["mlp.fc1_latent_proj.weight"] = ("mixer.fc1_latent_proj.weight",
                                               (h.latent, s.hidden))
        names["mlp.fc2_latent_proj.weight"] = ("mixer.fc2_latent_proj.weight",
                                               (s.hidden, h.latent))
    for j in range(s.experts):
        names[f"mlp.experts.local_experts.{j}.linear_fc1.weight"] = (
            f"mixer.experts.{j}.up_proj.weight", (h.moe_ffn, width))
        names[f"mlp.experts.local_experts.{j}.linear_fc2.weight"] = (
            f"mixer.experts.{j}.down_proj.weight", (width, h.moe_ffn))
    if h.shared_ffn is not None:
        names["mlp.shared_experts.linear_fc1.weight"] = (
            "mixer.shared_experts.up_proj.weight", (h.shared_ffn, s.hidden))
        names["mlp.shared_experts.linear_fc2.weight"] = (
            "mixer.shared_experts.down_proj.weight", (s.hidden, h.shared_ffn))
    return _copies(hf, mc, names)


HYBRID_LAYER_RULES = {"M": _mamba_rules, "*": _attention_rules, "-": _mlp_rules, "E": _moe_rules}


def _mtp_rules(s: Shapes, h: HybridShapes) -> list[Rule]:
    """Every MTP depth that holds weights: flat on the Hugging Face side, nested in Megatron's
    (module doc)."""
    found, depth_layers = [], len(h.mtp_pattern)
    for depth in range(h.mtp_built):
        mc, first = f"mtp.layers.{depth}.", depth * depth_layers
        last = first + depth_layers - 1
        found += _copies(f"mtp.layers.{first}.", mc, {
            "enorm.weight": ("enorm.weight", (s.hidden,)),
            "hnorm.weight": ("hnorm.weight", (s.hidden,)),
            "eh_proj.weight": ("eh_proj.weight", (s.hidden, 2 * s.hidden)),
        })
        for i, symbol in enumerate(h.mtp_pattern):
            found += HYBRID_LAYER_RULES[symbol](f"mtp.layers.{first + i}.",
                                                f"{mc}mtp_model_layer.layers.{i}.", s, h)
        found += _copies(f"mtp.layers.{last}.", mc, {
            "final_layernorm.weight": ("final_layernorm.weight", (s.hidden,))})
    return found


def rules(s: Shapes) -> list[Rule]:
    """NemotronH as transformers saves it (`backbone.*`, one tensor per expert; a release's
    `mtp.*` depths) <-> HybridModel (each layer one block: its norm and its mixer)."""
    found = [Rule("embedding.word_embeddings.weight", ("backbone.embeddings.weight",), "vocab")]
    for i, symbol in enumerate(s.hybrid.pattern):
        found += HYBRID_LAYER_RULES[symbol](f"backbone.layers.{i}.", f"decoder.layers.{i}.",
                                            s, s.hybrid)
    found += _mtp_rules(s, s.hybrid)
    found.append(Rule("decoder.final_norm.weight", ("backbone.norm_f.weight",), "copy",
                      (s.hidden,)))
    if not s.tied:
        found.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
    return found

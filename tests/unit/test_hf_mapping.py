"""The Hugging Face <-> Megatron Core mappings (trainer/models/<family>/hf_tensors.py and
hf_config.py, dispatched by trainer/interop/), without a process group: QKV interleaved per
query group, fused gate/up, vocabulary padding, the names and shapes
transformers writes, the published Llama 3 / Mixtral / Nemotron 3 Nano shapes against our
recipes, and NemotronH's config.json written back."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import make_hf_model
from trainer.interop import hf_config, memory
from trainer.interop.mapping import rules, shapes_of
from trainer.models.gpt.hf_tensors import Rule, Shapes, hf_shapes, to_hf, to_megatron
from trainer.models.hybrid import hf_config as nemotron_h_config

GQA = Shapes(layers=1, hidden=8, heads=4, groups=2, head_dim=2, ffn=6, vocab=5, padded_vocab=8,
             experts=None, tied=False)


def _numbered(rows: int, cols: int, start: int, dtype=torch.float32) -> torch.Tensor:
    return torch.arange(start, start + rows * cols, dtype=dtype).reshape(rows, cols)


def test_qkv_rows_are_grouped_q_heads_then_k_then_v() -> None:
    s, hd = GQA, GQA.head_dim
    q, k, v = _numbered(8, 8, 0), _numbered(4, 8, 1000), _numbered(4, 8, 2000)
    qkv = to_megatron(Rule("qkv", ("q", "k", "v"), "qkv"), [q, k, v], s)
    heads_per_group = s.heads // s.groups
    expected = []
    for g in range(s.groups):  # Megatron: [q heads of group g; k head g; v head g] per group
        expected += [q[g * heads_per_group * hd:(g + 1) * heads_per_group * hd],
                     k[g * hd:(g + 1) * hd], v[g * hd:(g + 1) * hd]]
    assert torch.equal(qkv, torch.cat(expected))
    assert qkv.shape == ((s.heads + 2 * s.groups) * hd, s.hidden)


@pytest.mark.parametrize("kind, parts", [("qkv", 3), ("gate_up", 2), ("vocab", 1), ("copy", 1)])
def test_round_trip_is_byte_identical_in_bf16(kind: str, parts: int) -> None:
    rule = Rule("m", tuple(f"h{i}" for i in range(parts)), kind)
    shapes = hf_shapes(rule, GQA) if kind != "copy" else [(3, 8)]
    originals = [torch.randn(shape).to(torch.bfloat16) for shape in shapes]
    back = to_hf(rule, to_megatron(rule, originals, GQA), GQA)
    for original, again in zip(originals, back, strict=True):
        assert again.dtype == torch.bfloat16
        assert again.view(torch.int16).equal(original.view(torch.int16))


def test_gate_up_is_gate_then_up_and_vocab_padding_is_zero_rows() -> None:
    gate, up = _numbered(6, 8, 0), _numbered(6, 8, 100)
    assert torch.equal(to_megatron(Rule("f", ("g", "u"), "gate_up"), [gate, up], GQA),
                       torch.cat([gate, up]))
    embedding = _numbered(5, 8, 1)
    padded = to_megatron(Rule("e", ("e",), "vocab"), [embedding], GQA)
    assert padded.shape == (8, 8)
    assert torch.equal(padded[:5], embedding) and torch.count_nonzero(padded[5:]) == 0


@pytest.mark.parametrize("kind, recipe", [("llama", "hf_tiny_llama"),
                                          ("mixtral", "hf_tiny_mixtral"),
                                          ("nemotron_h", "hf_tiny_nemotron_h")])
def test_names_and_shapes_are_the_ones_transformers_writes(kind, recipe, tmp_path) -> None:
    saved = make_hf_model(kind, tmp_path / kind)
    with safe_open(saved / "model.safetensors", framework="pt") as f:
        written = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    cfg = get_recipe(recipe)
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    ours = {name: shape for rule in rules(shapes)
            for name, shape in zip(rule.hf, hf_shapes(rule, shapes), strict=True)}
    assert ours == written


# Published config.json values (the fields the mapping reads) and parameter counts.
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
             "tie_word_embeddings": False, "vocab_size": 128256, "hidden_act": "silu"}
LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672,
              "num_attention_heads": 64, "num_hidden_layers": 80}
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "rms_norm_eps": 1e-05, "rope_theta": 1e6, "tie_word_embeddings": False,
                "vocab_size": 32000, "hidden_act": "silu"}
PUBLISHED = [
    ("llama3_8b_tp8_dp8", LLAMA3_8B, 8_030_261_248),
    ("llama3_70b_tp4_pp4_cp2_vpp5_dp2", LLAMA3_70B, 70_553_706_496),
    ("mixtral_8x7b_tp1_pp4_ep8_dp16", MIXTRAL_8X7B, 46_702_792_704),
]


@pytest.mark.parametrize("recipe, published, parameters", PUBLISHED)
def test_published_configs_match_our_recipes_and_parameter_counts(
    recipe, published, parameters
) -> None:
    cfg = get_recipe(recipe)
    hf_config.compare_with_recipe(published, cfg.model, recipe)  # raises on any difference
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    count = sum(torch.Size(shape).numel() for rule in rules(shapes)
                for shape in hf_shapes(rule, shapes))
    assert count == parameters


def test_memory_estimates_for_llama3_8b_in_bf16() -> None:
    """Must-show 6's estimate for the 8B shape (bf16, vocabulary padded for TP8)."""
    cfg = get_recipe("llama3_8b_tp8_dp8")
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    weights = memory.hf_bytes(shapes, 2)
    imported = memory.import_peak(shapes, 2)
    exported = memory.export_peak(shapes, 2, 5 * 1024**3)
    assert weights == 2 * 8_030_261_248  # the sum of the published shards, headers aside
    assert weights < imported < weights + 2**30  # + padding (2 x 768 rows) + one fused input
    assert exported < imported / 2  # streamed: embedding twice + one 5 GiB shard
    print(f"\nLlama-3-8B bf16: shards {weights / 1e9:.2f} GB; import holds "
          f"{imported / 1e9:.2f} GB, export {exported / 1e9:.2f} GB of weights at the peak")


# Nemotron 3 Nano 30B-A3B's config.json: the fields the mapping reads (and the flags it checks).
NEMOTRON3_NANO = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_hidden_layers": 52, "hidden_size": 2688, "vocab_size": 131072,
    "tie_word_embeddings": False, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 128, "intermediate_size": 1856, "mamba_num_heads": 64, "mamba_head_dim": 64,
    "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4, "chunk_size": 128,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1,
    "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-05,
    "use_bias": False, "mlp_bias": False, "attention_bias": False, "use_conv_bias": True,
    "residual_in_fp32": False, "time_step_min": 0.001, "sliding_window": None,
}


def test_published_nemotron3_nano_config_matches_our_recipe_and_parameter_count() -> None:
    recipe = "nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16"
    cfg = get_recipe(recipe)
    hf_config.compare_with_recipe(NEMOTRON3_NANO, cfg.model, recipe)  # raises on any difference
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    tensors = [(rule, shape) for rule in rules(shapes) for shape in hf_shapes(rule, shapes)]
    count = sum(torch.Size(shape).numel() for rule, shape in tensors
                if not rule.megatron.endswith("expert_bias"))  # a buffer, not a parameter
    assert count == 31_577_937_344  # the dry run's total, docs/hybrid-models.md
    assert sum(rule.megatron.endswith("expert_bias") for rule, _ in tensors) == 23


# Nemotron 3 Super 120B-A12B's config.json (a third-party transcription of the release's): the
# fields the mapping reads, its latent MoE and its one stored MTP depth.
NEMOTRON3_SUPER = {
    **NEMOTRON3_NANO,
    "hybrid_override_pattern": ("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                                "EMEMEMEMEM*EMEMEMEM*EMEMEMEME"),
    "num_hidden_layers": 88, "hidden_size": 4096, "intermediate_size": 2688,
    "mamba_num_heads": 128, "n_routed_experts": 512, "num_experts_per_tok": 22,
    "moe_intermediate_size": 2688, "moe_shared_expert_intermediate_size": 5376,
    "moe_latent_size": 1024, "routed_scaling_factor": 5.0, "num_nextn_predict_layers": 1,
    "mtp_hybrid_override_pattern": "*E",
}


def test_published_nemotron3_super_config_matches_our_recipe_and_parameter_count() -> None:
    """The release stores one MTP depth (mtp.layers.0-1: attention, latent MoE) that the
    recipe runs twice; its tensors are the dry run's total, MTP depth included."""
    recipe = "nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"
    cfg = get_recipe(recipe)
    hf_config.compare_with_recipe(NEMOTRON3_SUPER, cfg.model, recipe)
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    tensors = [(rule, shape) for rule in rules(shapes) for shape in hf_shapes(rule, shapes)]
    count = sum(torch.Size(shape).numel() for rule, shape in tensors
                if not rule.megatron.endswith("expert_bias"))
    assert count == 123_611_012_096  # tests/unit/test_dry_run.py
    names = [name for rule, _ in tensors for name in rule.hf]
    assert {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.mixer.q_proj.weight",
            "mtp.layers.1.mixer.fc1_latent_proj.weight", "mtp.layers.1.final_layernorm.weight",
            "backbone.layers.1.mixer.experts.511.up_proj.weight"} <= set(names)
    assert sum(rule.megatron.endswith("expert_bias") for rule, _ in tensors) == 41
    twice = {**NEMOTRON3_SUPER, "num_nextn_predict_layers": 2}
    with pytest.raises(ConfigError, match=re.escape(
            "num_nextn_predict_layers=2 of layers '*E' but the recipe's pattern stores 1 MTP "
            "depth(s) of '*E' (2 run)")):
        hf_config.compare_with_recipe(twice, cfg.model, recipe)


def test_nemotron_h_config_written_back_is_read_as_the_same_model() -> None:
    """From scratch: transformers' own config class reads the export (block types, dt clamp at
    0); from an import: its fields and its pattern's form are kept."""
    from transformers import NemotronHConfig

    model = get_recipe("hf_tiny_nemotron_h").model
    written = hf_config.hf_config_for(model, "float32")
    hf_config.compare_with_recipe(written, model, "hf_tiny_nemotron_h")
    loaded = NemotronHConfig.from_dict(written)
    assert loaded.hybrid_override_pattern == "M*-E" and loaded.time_step_min == 0.0
    assert (loaded.n_routed_experts, loaded.moe_shared_expert_intermediate_size) == (4, 48)
    nano = get_recipe("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16").model
    again = hf_config.hf_config_for(nano, "bfloat16", NEMOTRON3_NANO)
    assert again["hybrid_override_pattern"] == NEMOTRON3_NANO["hybrid_override_pattern"]
    assert "layers_block_type" not in again and again["time_step_min"] == 0.001
    assert {k: again[k] for k in NEMOTRON3_NANO} == NEMOTRON3_NANO


def test_nemotron_h_block_types_give_the_pattern_in_every_spelling() -> None:
    blocks = {"layers_block_type": ["mamba", "attention", "mlp", "moe"]}
    assert nemotron_h_config.hf_pattern(blocks) == "M*-E"
    assert nemotron_h_config.hf_pattern({"layer_types": ["linear_attention", "full_attention"]}) \
        == "M*"
    assert nemotron_h_config.hf_pattern({"hybrid_override_pattern": "ME*-"}) == "ME*-"

"""Nemotron-4's half-rotated heads and LayerNorm1p reach Megatron through the one translation.

`model.rotary_percent` reaches the rotary embedding of the real `GPTModel` and `HybridModel`
(built on one CPU rank here: its rotary table holds the frequencies of half of each head),
`model.layernorm_zero_centered_gamma` reaches `TransformerConfig` (Transformer Engine's norms
read it; a weights-only build on the local layers leaves it out, the same weights). Both leave
the planner's parameters and FLOPs as they are, and both are written and read back as
Megatron-LM's flags. The HF interop refuses them in one line (no Llama or NemotronH form).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.plan.flops import step_flops
from recipes.plan.params import model_parameters, stage_params
from recipes.registry import get_recipe
from tests.one_rank_world import one_rank_world

# A HybridModel of attention and MLP layers (Mamba layers need the CPU runtime's kernels, which
# a test process does not install).
ROPE_HYBRID = ["model.position_embedding=rope", "model.hybrid_layer_pattern='*-*-*-'"]


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo world with Megatron's process groups, torn down after the test."""
    with one_rank_world(tmp_path) as initialize:
        yield initialize


def _model(cfg):
    from plugins.protocol.hooks import PluginSet
    from trainer.mcore_translation import build_transformer_config
    from trainer.model import build_model_chunks

    torch.manual_seed(0)
    config = build_transformer_config(cfg, cpu_initialization=True)
    return build_model_chunks(cfg, config, PluginSet())[0]


@pytest.mark.parametrize(("recipe", "extra"), [("tiny_dp1", []),
                                                ("hybrid_tiny_dp1", ROPE_HYBRID)])
def test_rotary_percent_reaches_the_model(one_rank, recipe, extra) -> None:
    full = apply_overrides(get_recipe(recipe), [*extra, "cluster.device=cpu"])
    half = apply_overrides(full, ["model.rotary_percent=0.5"])
    one_rank(full)
    width = full.model.kv_channels or full.model.hidden_size // full.model.num_attention_heads
    models = {"full": _model(full), "half": _model(half)}
    # One frequency per rotated channel pair (rotary_pos_embedding.py:72-80).
    assert models["full"].rotary_pos_emb.inv_freq.numel() == width // 2
    assert models["half"].rotary_pos_emb.inv_freq.numel() == width // 4
    # Frequencies of a table over the first half of each head's channels (the rest pass
    # unrotated: rope_utils.py:121-124 splits at the table's width).
    dim, base = width // 2, half.model.rotary_base
    expected = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    assert torch.allclose(models["half"].rotary_pos_emb.inv_freq, expected)


def test_zero_centered_gamma_reaches_the_transformer_config() -> None:
    from trainer.mcore_translation import build_transformer_config

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["model.layernorm_zero_centered_gamma=true"])
    assert build_transformer_config(cfg, cpu_initialization=True).layernorm_zero_centered_gamma
    # A weights-only build on the local layers: the same parameters, without the torch norm's
    # refusal (transformer/torch_norm.py:44-46).
    meta = build_transformer_config(cfg, cpu_initialization=True, meta_device=True)
    assert not meta.layernorm_zero_centered_gamma
    plain = build_transformer_config(get_recipe("tiny_dp1"), cpu_initialization=True)
    assert not plain.layernorm_zero_centered_gamma


@pytest.mark.parametrize("recipe", ["tiny_tp2_pp2", "nemotron4_15b_tp8_pp2_dp4"])
def test_neither_changes_parameters_nor_flops(recipe) -> None:
    cfg = get_recipe(recipe)
    m = cfg.model
    changed = dataclasses.replace(cfg, model=dataclasses.replace(
        m, rotary_percent=0.25 if m.rotary_percent == 1.0 else 1.0,
        layernorm_zero_centered_gamma=not m.layernorm_zero_centered_gamma))
    assert stage_params(changed) == stage_params(cfg)
    assert model_parameters(changed) == model_parameters(cfg)
    assert step_flops(changed) == step_flops(cfg)


def test_megatron_lm_flags_carry_both() -> None:
    from recipes.config.megatron_args import to_megatron_args
    from trainer.tools.megatron_args import config_from_megatron_args

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["model.rotary_percent=0.5",
                                                   "model.layernorm_zero_centered_gamma=true"])
    args = to_megatron_args(cfg)
    assert args[args.index("--rotary-percent") + 1] == "0.5" and "--apply-layernorm-1p" in args
    back, _ = config_from_megatron_args(args, cfg.cluster)
    assert back.model.rotary_percent == 0.5 and back.model.layernorm_zero_centered_gamma


@pytest.mark.parametrize(("override", "message"), [
    ("model.rotary_percent=0.5", "model.rotary_percent=0.5"),
    ("model.layernorm_zero_centered_gamma=true", "model.layernorm_zero_centered_gamma=True"),
])
def test_llama_interop_refuses_them_in_one_line(override, message) -> None:
    from trainer.models.gpt.hf_config import hf_config_for

    cfg = apply_overrides(get_recipe("hf_tiny_llama"), [override])
    with pytest.raises(ConfigError) as caught:
        hf_config_for(cfg.model, "bfloat16")
    text = str(caught.value)
    assert message in text and "is not Llama/Mixtral-shaped" in text and "\n" not in text


def test_llama_import_refuses_a_partial_rotary_factor() -> None:
    from trainer.models.gpt.hf_config import hf_config_for, hf_values

    hf = hf_config_for(get_recipe("hf_tiny_llama").model, "bfloat16")
    with pytest.raises(ConfigError, match="partial_rotary_factor=0.5 is not mapped"):
        hf_values({**hf, "partial_rotary_factor": 0.5})


def test_nemotron_h_interop_refuses_layernorm1p() -> None:
    from trainer.models.hybrid.hf_config import hf_config_for

    cfg = apply_overrides(get_recipe("hybrid_tiny_dp1"),
                          ["model.layernorm_zero_centered_gamma=true"])
    with pytest.raises(ConfigError, match="is not NemotronH-shaped .*"
                                          "model.layernorm_zero_centered_gamma=True"):
        hf_config_for(cfg.model, "bfloat16")

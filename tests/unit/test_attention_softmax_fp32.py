"""`model.attention_softmax_in_fp32`: the attention softmax's precision in a bf16/fp16 run.

It reaches Megatron Core's `TransformerConfig` through the one translation, and the local
attention's softmax built from it (on one CPU rank, in bf16: its gradients differ between the
two values); Megatron-LM's `--attention-softmax-in-fp32` carries it both ways (written only when
true, Megatron-LM's default being off), from a command line and from a Megatron-LM checkpoint's
saved arguments. The Nemotron hybrid recipes set it false, as Megatron Bridge's Nemotron-H
providers do; the project's other recipes keep the default, true.
"""

from __future__ import annotations

import pytest
import torch

from recipes.config.megatron_args import to_megatron_args
from recipes.config.overrides import apply_overrides
from recipes.registry import RECIPES, get_recipe
from recipes.sources import settings_of
from tests.one_rank_world import one_rank_world
from trainer.mcore_translation import build_transformer_config
from trainer.tools.megatron_args import config_from_megatron_args, megatron_parser

FLAG = "--attention-softmax-in-fp32"
# The Nemotron recipes whose model is Megatron Bridge's Nemotron-H provider or bridge.
BRIDGE_HYBRIDS = [name for name in RECIPES if name.startswith(
    ("nemotron_h_", "nemotron_nano_v2_", "nemotron3_"))]


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo world with Megatron's process groups, torn down after the test."""
    with one_rank_world(tmp_path) as initialize:
        yield initialize


def _off(cfg):
    return apply_overrides(cfg, ["model.attention_softmax_in_fp32=false"])


@pytest.mark.parametrize("value", [True, False])
def test_the_field_reaches_the_transformer_config(value) -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), [f"model.attention_softmax_in_fp32={value}"])
    assert build_transformer_config(cfg, cpu_initialization=True).attention_softmax_in_fp32 is (
        value)


def _softmax_grad(cfg) -> torch.Tensor:
    """The gradient through the first layer's softmax of the model built from `cfg`, for bf16
    scores under a causal mask."""
    from plugins.protocol.hooks import PluginSet
    from trainer.model import build_model_chunks

    config = build_transformer_config(cfg, cpu_initialization=True)
    model = build_model_chunks(cfg, config, PluginSet())[0]
    softmax = model.decoder.layers[0].self_attention.core_attention.scale_mask_softmax
    assert softmax.softmax_in_fp32 is cfg.model.attention_softmax_in_fp32
    s, draws = cfg.model.seq_length, torch.Generator().manual_seed(0)
    scores = (torch.randn(2, 4, s, s, generator=draws) * 8).bfloat16().requires_grad_()
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]
    probs = softmax(scores * 1, mask)  # a copy: the bf16 path masks its input in place
    assert probs.dtype == torch.bfloat16
    probs.backward(torch.randn(2, 4, s, s, generator=draws).bfloat16())
    return scores.grad


def test_the_local_attention_normalises_in_bf16_when_false(one_rank) -> None:
    """On CPU the bf16 softmax's forward rounds as the fp32 one cast back; its backward, from
    bf16 probabilities, does not."""
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["precision.dtype=bf16", "cluster.device=cpu"])
    one_rank(cfg)
    fp32, bf16 = _softmax_grad(cfg), _softmax_grad(_off(cfg))
    assert not torch.equal(fp32, bf16)


def test_the_flag_is_written_only_when_true_and_read_back_as_given() -> None:
    on = get_recipe("tiny_dp1")
    assert FLAG in to_megatron_args(on) and FLAG not in to_megatron_args(_off(on))
    for cfg in (on, _off(on)):
        back, notes = config_from_megatron_args(to_megatron_args(cfg), cfg.cluster)
        assert back.model.attention_softmax_in_fp32 is cfg.model.attention_softmax_in_fp32
        assert not any(FLAG in note for note in notes)
    bare, notes = config_from_megatron_args(["--num-layers", "4"])
    assert bare.model.attention_softmax_in_fp32 is False  # Megatron-LM's default
    assert not any(FLAG in note for note in notes)


@pytest.mark.parametrize("value", [True, False])
def test_a_megatron_lm_checkpoint_carries_its_setting(value) -> None:
    """What Megatron-LM saves as `args` holds the flag's value (False when not typed)."""
    from trainer.checkpoint.megatron_lm import config_from_args

    cfg = apply_overrides(get_recipe("tiny_dp1"), [f"model.attention_softmax_in_fp32={value}"])
    args = vars(megatron_parser().parse_known_args(to_megatron_args(cfg))[0])
    assert config_from_args(args)["model"]["attention_softmax_in_fp32"] is value


def test_the_nemotron_hybrids_set_bridges_value_and_cite_it() -> None:
    assert len(BRIDGE_HYBRIDS) == 11
    for name in BRIDGE_HYBRIDS:
        cfg = get_recipe(name)
        assert build_transformer_config(cfg, cpu_initialization=True,
                                        meta_device=True).attention_softmax_in_fp32 is False
        source = settings_of(RECIPES[name])["model.attention_softmax_in_fp32"].source
        assert "nemotron_h_provider.py:43" in source.where


@pytest.mark.parametrize("name", ["tiny_dp1", "hybrid_tiny_dp1", "super_tiny_dp1",
                                  "llama3_8b_tp8_dp8", "mixtral_8x7b_tp1_pp4_ep8_dp16"])
def test_the_other_recipes_keep_the_projects_default(name) -> None:
    assert get_recipe(name).model.attention_softmax_in_fp32 is True

"""The GPU fast paths, pinned on CPU: with Transformer Engine's layers every recipe's
TransformerConfig has the fusions Megatron-LM and Bridge use (each off only for its reason);
with the local layers none; a GPU node without TE is refused before launch; the dry run builds
TE layers on the meta device."""

from __future__ import annotations

import dataclasses

import pytest
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers
from megatron.core.transformer import TransformerConfig

from plugins.protocol.errors import ConfigError
from recipes.config.machine import MachineInfo, check_machine
from recipes.config.overrides import apply_overrides
from recipes.plan.fit import local_attention_cost
from recipes.registry import RECIPES, get_recipe
from trainer.mcore_translation import FUSIONS, build_transformer_config, fusions_line


@pytest.fixture
def te_kernels(monkeypatch):
    """What TransformerConfig checks for on a GPU node with TE (and APEX's wgrad kernel)."""
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)


@pytest.mark.parametrize("name", list(RECIPES))
def test_transformer_engine_layers_get_every_fusion_that_applies(name, te_kernels):
    cfg = get_recipe(name)
    config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    m = cfg.model
    assert config.bias_activation_fusion == (m.activation == "swiglu" or (
        m.activation == "gelu" and m.add_bias_linear))  # no kernel for squared ReLU
    assert config.apply_rope_fusion == (m.position_embedding == "rope")
    assert config.bias_dropout_fusion and config.masked_softmax_fusion
    # Megatron FSDP fuses the weight-gradient accumulation only with TE >= 2.10
    # (mcore_fsdp_adapter.py:147-151); no TE here
    fused_wgrad = cfg.optimizer.fsdp == "none"
    assert config.persist_layer_norm and config.gradient_accumulation_fusion == fused_wgrad
    assert config.cross_entropy_loss_fusion and config.cross_entropy_fusion_impl == "native"
    off = {"bias_activation_fusion": not config.bias_activation_fusion,
           "apply_rope_fusion": m.position_embedding != "rope",  # hybrids: no positions
           "gradient_accumulation_fusion": not fused_wgrad}
    on = [f for f in FUSIONS if not off.get(f, False)]
    assert fusions_line(config).startswith(f"layers: Transformer Engine's; fusions on: "
                                           f"{', '.join(on)}; off: ")


def test_squared_relu_recipes_are_the_ones_without_the_activation_fusion(te_kernels):
    config = build_transformer_config(get_recipe("nemotron4_15b_tp8_pp2_dp4"),
                                      cpu_initialization=False, transformer_engine=True)
    assert not config.bias_activation_fusion and config.apply_rope_fusion


def test_without_apex_the_wgrad_accumulation_fusion_stays_off(monkeypatch):
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    config = build_transformer_config(get_recipe("llama3_8b_tp8_dp8"), cpu_initialization=False,
                                      transformer_engine=True)
    assert not config.gradient_accumulation_fusion and config.bias_activation_fusion


@pytest.mark.parametrize("name", ["tiny_dp1", "llama3_8b_tp8_dp8", "mixtral_tiny_ep1"])
def test_local_layers_keep_megatrons_defaults(name):
    config = build_transformer_config(get_recipe(name), cpu_initialization=True)
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert {k: getattr(config, k) for k in FUSIONS} == {k: defaults[k] for k in FUSIONS}


GPU_NODE = MachineInfo(gpus=4, launched_world_size=None, compute_capability=(9, 0),
                       transformer_engine=None)


def test_a_gpu_node_without_transformer_engine_is_refused_before_launch():
    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), [])
    with pytest.raises(ConfigError) as caught:
        check_machine(cfg, GPU_NODE, local_attention_cost=local_attention_cost)
    assert str(caught.value) == (
        "model.transformer_impl=auto builds Transformer Engine's layers on GPUs, but "
        "Transformer Engine is not installed here; install the gpu extra (pip install -e "
        "'.[gpu]', docs/precision.md), or run Megatron Core's local layers with "
        "model.transformer_impl=local (unfused attention that keeps every score: 0.26 MB per "
        "layer and micro-batch at seq_length 128; no FP8, no packed THD)")
    check_machine(apply_overrides(cfg, ["model.transformer_impl=local"]), GPU_NODE)
    with_te = dataclasses.replace(GPU_NODE, transformer_engine="2.8.0")
    check_machine(cfg, with_te)


def test_the_score_memory_is_the_planners_score_term():
    """b x heads/TP x s x s x bytes: Llama-3-8B at TP8, mbs 2, bf16, seq 8192 keeps
    2 x 32/8 x 8192^2 x 2 bytes = 1.07 GB per layer; attention dropout adds a one-byte mask and
    a bf16 output per score, 2.5x that; the planner's explicit activations hold the same."""
    from recipes.plan.activations import attention_score_bytes, layer_bytes

    cfg = get_recipe("llama3_8b_tp8_dp8")
    assert attention_score_bytes(cfg) == 2 * 32 // 8 * 8192 ** 2 * 2
    dropout = apply_overrides(cfg, ["model.attention_dropout=0.1"])
    assert attention_score_bytes(dropout) == 2.5 * attention_score_bytes(cfg)
    kept = layer_bytes(cfg, "explicit") - layer_bytes(cfg, "flash")
    flash_lse = 2 * 8192 * 4 * 32 / 8
    assert kept == attention_score_bytes(cfg) - flash_lse
    assert local_attention_cost(cfg) == "1.07 GB per layer and micro-batch at seq_length 8192"


def test_cpu_ranks_cannot_be_asked_for_transformer_engine():
    cfg = apply_overrides(get_recipe("tiny_dp2"), ["model.transformer_impl=transformer_engine"])
    cpu = MachineInfo(gpus=0, launched_world_size=None, compute_capability=None,
                      transformer_engine=None)
    with pytest.raises(ConfigError, match="needs GPU ranks, but this run's ranks are on CPU"):
        check_machine(cfg, cpu)


def test_the_dry_run_builds_transformer_engine_layers_on_the_meta_device(monkeypatch):
    """On a GPU login node with TE the dry run hands TE's layers the meta device: CPU
    initialisation would allocate every shard for real (extensions/transformer_engine.py)."""
    from megatron.core.extensions import transformer_engine as te_extension

    from trainer import model
    from trainer.tools import dry_run

    seen = {}

    def capture(cfg, config, plugins):
        seen["config"] = config
        raise StopIteration  # the TE layers themselves need the package: stop before them

    monkeypatch.setattr(model, "transformer_engine_in_use", lambda cfg: True)
    monkeypatch.setattr(model, "build_model_chunks", capture)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    with pytest.raises(StopIteration):
        dry_run._build_on_meta(get_recipe("tiny_dp1"), plugins=_no_plugins())
    config = seen["config"]
    assert config.init_model_with_meta_device and not config.use_cpu_initialization
    monkeypatch.setattr(te_extension, "is_te_min_version", lambda version: True)
    assert te_extension._get_extra_te_kwargs(config)["device"] == "meta"


def _no_plugins():
    from plugins.protocol.hooks import PluginSet

    return PluginSet()


def test_the_local_layers_on_gpus_are_said_with_their_score_memory(capsys):
    """Asked for explicitly, the local layers run, and the pre-flight says what they cost:
    mbs 2 x 32/8 heads x 8192^2 scores x 2 bytes = 1.07 GB per layer for Llama-3-8B at TP8."""
    from trainer.entry.pipeline import preflight

    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), ["model.transformer_impl=local"])
    preflight(cfg, GPU_NODE)
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("note: model.transformer_impl=local runs Megatron "
                                          "Core's unfused attention on the GPUs")
    from recipes.plan.fit import local_attention_note

    assert "keeps its scores: 1.07 GB per layer and micro-batch at seq_length 8192" in \
        local_attention_note(get_recipe("llama3_8b_tp8_dp8"))

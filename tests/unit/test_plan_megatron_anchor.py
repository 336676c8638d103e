"""The planner against Megatron-LM's own estimator (`megatron.training.theoretical_memory_usage`)
where both apply; each deliberate difference is asserted as the difference it is.

Megatron's activation formula (Korthikanti et al., Table 2) assumes a GELU MLP, multi-head
attention (no GQA), dropout on, selective recompute and sequence parallel; its weight formula
assumes BF16 with FP32 main gradients and ignores biases. Inside those assumptions the numbers
are equal; outside them the planner counts what the model actually holds.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from megatron.training.theoretical_memory_usage import (
    compute_activation_memory,
    compute_weight_and_optimizer_memory,
)

from recipes.plan.activations import layer_bytes, stage_activations
from recipes.plan.memory import rank_model_state, state_bytes_of
from recipes.plan.params import stage_params
from recipes.registry import get_recipe


def _covered(pipeline: int = 1, virtual: int | None = None, gbs: int = 64):
    """A config inside Megatron's assumptions: MHA, GELU 4h, dropout on, SP, selective."""
    cfg = copy.deepcopy(get_recipe("llama3_8b_tp8_dp8"))
    m, p = cfg.model, cfg.parallel
    m.num_query_groups, m.activation, m.ffn_hidden_size = None, "gelu", 4 * m.hidden_size
    m.hidden_dropout = m.attention_dropout = 0.1
    m.seq_length = 4096
    p.pipeline, p.virtual_pipeline = pipeline, virtual
    cfg.cluster.nodes = pipeline * 8  # keeps DP8
    cfg.train.recompute, cfg.train.global_batch_size, cfg.train.micro_batch_size = (
        "selective", gbs, 1)
    return cfg


def _megatron_args(cfg) -> SimpleNamespace:
    m, layout = cfg.model, cfg.layout
    return SimpleNamespace(
        seq_length=m.seq_length, micro_batch_size=cfg.train.micro_batch_size,
        hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        kv_channels=m.hidden_size // m.num_attention_heads,
        group_query_attention=m.num_query_groups is not None,
        num_query_groups=m.num_query_groups, num_experts=None, swiglu=m.activation == "swiglu",
        moe_shared_expert_intermediate_size=None, moe_latent_size=None, mtp_num_layers=None,
        multi_latent_attention=False, normalization=m.normalization,
        padded_vocab_size=layout.padded_vocab, add_bias_linear=m.add_bias_linear,
        untie_embeddings_and_output_weights=not m.share_embeddings_and_output_weights,
        expert_tensor_parallel_size=layout.expert_tensor_size,
        expert_model_parallel_size=layout.expert, world_size=layout.world_size,
        pipeline_model_parallel_size=layout.pipeline,
        virtual_pipeline_model_parallel_size=layout.virtual_pipeline,
        tensor_model_parallel_size=layout.tensor, data_parallel_size=layout.data_parallel,
        use_distributed_optimizer=cfg.optimizer.distributed,
    )


@pytest.mark.parametrize(("pipeline", "virtual"), [(1, None), (4, None), (4, 2)])
def test_first_stage_activations_equal_megatron(pipeline, virtual):
    """Without pipelining the first stage is the last: Megatron's estimator counts the output
    layer's inputs and FP32 logits (4 bytes a logit), the planner also the BF16 logits held
    beside them while the loss casts them (2 bytes a logit, `activations.cast_logits_bytes`)."""
    cfg = _covered(pipeline, virtual)
    ours = stage_activations(cfg, "flash", te_layers=True)[0].total
    theirs = compute_activation_memory(_megatron_args(cfg), cfg.layout.microbatches)
    bf16_logits = cfg.model.seq_length * 2 * cfg.layout.padded_vocab / cfg.layout.tensor
    assert ours - theirs == pytest.approx(bf16_logits if pipeline == 1 else 0.0, abs=1.0)


def test_per_layer_is_korthikanti_34_sbh_over_t():
    cfg = _covered()
    s, b, h, t = cfg.model.seq_length, 1, cfg.model.hidden_size, cfg.layout.tensor
    assert layer_bytes(cfg, "flash") == pytest.approx(s * b * h * 34 / t)
    # Without recompute, explicit attention adds 5·a·s²·b / t (softmax, mask, dropout output).
    a = cfg.model.num_attention_heads
    assert layer_bytes(cfg, "explicit", "none") == pytest.approx(
        s * b * h * 34 / t + 5 * a * s * s * b / t)


def test_gqa_and_swiglu_are_deliberate_differences():
    """Llama-3-8B (GQA 32/8, SwiGLU): Q/K/V are (h + 2·h/4)·2 bytes, not 6h; the gated MLP
    keeps 2·f more per token than Megatron's 4·f/h term."""
    cfg = _covered()
    covered = layer_bytes(cfg, "flash")
    cfg.model.num_query_groups, cfg.model.activation = 8, "swiglu"
    s, h, f, t = cfg.model.seq_length, cfg.model.hidden_size, cfg.model.ffn_hidden_size, 8
    expected = covered - s * 2 * (2 * h - 2 * h // 4) / t + s * 2 * f / t
    assert layer_bytes(cfg, "flash") == pytest.approx(expected)


def test_model_state_equals_megatron_without_pipelining():
    cfg = get_recipe("llama3_8b_tp8_dp8")  # bf16, FP32 main grads, distributed optimizer
    ours = rank_model_state(cfg, stage_params(cfg)[0], state_bytes_of(cfg), "dist_opt").total
    assert ours == pytest.approx(compute_weight_and_optimizer_memory(_megatron_args(cfg)),
                                 rel=1e-12)


def test_pipeline_final_norm_is_a_deliberate_difference():
    """Megatron spreads the final norm over all stages; it lives on the last stage only."""
    cfg = get_recipe("llama3_8b_tp8_pp4_dp2")
    counts = stage_params(cfg)
    ours = rank_model_state(cfg, counts[0], state_bytes_of(cfg), "dist_opt").total
    theirs = compute_weight_and_optimizer_memory(_megatron_args(cfg))
    per_param = 6 + 12 / cfg.layout.data_parallel
    assert theirs - ours == pytest.approx(cfg.model.hidden_size / 4 * per_param, rel=1e-9)

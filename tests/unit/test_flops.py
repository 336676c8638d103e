"""The one FLOPs definition (recipes/plan/flops.py): against Megatron-LM's
`num_floating_point_operations` where both apply, against a hand count of Mixtral-8x7B's
published shape, the same for the planner and the trainer on every recipe, and the choices it
states: causal attention counted half, GQA, SwiGLU, MoE's routed and shared experts,
recomputation not counted."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from megatron.training.training import num_floating_point_operations

from recipes.models.gpt.flops import attention_score_flops
from recipes.plan.build import make_plan
from recipes.plan.cluster import recipe_cluster
from recipes.plan.flops import (
    FlopsShape,
    forward_flops_per_token,
    model_flops_per_token,
    step_flops,
    tflops_per_gpu,
    training_flops,
)
from recipes.registry import RECIPES, get_recipe
from trainer.throughput import trained_sequences


def _megatron_args(cfg) -> SimpleNamespace:
    m = cfg.model
    return SimpleNamespace(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        seq_length=m.seq_length, num_attention_heads=m.num_attention_heads,
        kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
        group_query_attention=m.num_query_groups is not None,
        num_query_groups=m.num_query_groups, swiglu=m.activation == "swiglu",
        num_experts=m.num_moe_experts, moe_layer_freq=1, moe_router_topk=m.moe_router_topk,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size, moe_latent_size=None,
        moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        multi_latent_attention=False, attention_output_gate=False,
        experimental_attention_variant=None, hybrid_layer_pattern=None,
        is_hybrid_model=False, padded_vocab_size=cfg.layout.padded_vocab,
    )


@pytest.mark.parametrize("name", [
    "tiny_dp1",  # GELU, multi-head
    "llama3_8b_tp8_dp8",  # SwiGLU, GQA 8 groups
    "llama3_70b_tp4_pp4_cp2_vpp5_dp2",  # CP and interleaving change nothing
    "nemotron4_15b_tp8_pp2_dp4",  # squared ReLU: two matrices, like GELU
    "mixtral_8x7b_tp1_pp4_ep8_dp16",  # MoE: top-2 of 8 experts
    "mixtral_tiny_ep1",
])
def test_equals_megatron_training_formula(name):
    cfg = get_recipe(name)
    ours = step_flops(cfg)
    theirs = num_floating_point_operations(_megatron_args(cfg), cfg.train.global_batch_size)
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_packed_documents_count_their_own_squares_like_megatron():
    cfg = get_recipe("llama3_8b_tp8_dp8")
    lengths = [1000, 3000, 96]  # one 4,096-token row holding three documents
    ours = training_flops(FlopsShape.from_config(cfg), sum(lengths), sum(n * n for n in lengths))
    theirs = num_floating_point_operations(
        _megatron_args(cfg), 1, seqlen_squared_sum_in_batch=sum(n * n for n in lengths),
        total_real_tokens_in_batch=sum(lengths))
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_mixtral_8x7b_equals_a_hand_count_of_its_published_shape():
    """Mixtral-8x7B: 32 layers, hidden 4096, 32 query heads of 128 over 8 KV groups, 8 SwiGLU
    experts of width 14336 with 2 routed per token, vocabulary 32000; 4096-token rows."""
    cfg = get_recipe("mixtral_8x7b_tp1_pp4_ep8_dp16")
    hidden, layers, seq, vocab = 4096, 32, 4096, 32000
    q, kv = 32 * 128, 8 * 128
    projections = 2 * hidden * q + 2 * (2 * hidden * kv) + 2 * q * hidden  # Q, K and V, out
    experts = 2 * (3 * 2 * hidden * 14336)  # two routed experts, three matrices each
    scores = 2 * (2 * q) * seq / 2  # QK^T and PV over half the row under the causal mask
    forward = layers * (projections + experts + scores) + 2 * hidden * vocab
    assert model_flops_per_token(cfg) == 3 * forward
    # The active path is about a quarter of the 46.7B parameters, so 6 x all of them overstates
    # the work about 3.6 times: the planner's step time once did.
    assert 6 * 46.7e9 / model_flops_per_token(cfg) > 3.3


@pytest.mark.parametrize("name", list(RECIPES))
def test_planner_and_trainer_count_the_same_flops(name):
    """The planner's FLOPs of a step (its step time and GPU-hours) are the FLOPs the trainer
    divides by the step time for model TFLOP/s and MFU on full rows: `trainer/step_figures.py`
    passes `training_flops` the world's sum of each replica's `trained_sequences` (tokens,
    squared lengths) of its micro-batches (packed rows count their documents:
    tests/dist/test_prepared_data.py)."""
    cfg = get_recipe(name)
    batch = make_plan(cfg, recipe_cluster(cfg)).batch
    layout, seq = cfg.layout, cfg.model.seq_length
    # Unpacked micro-batches of full rows; only their shape is read, so one element expanded.
    microbatch = {"tokens": torch.zeros((), dtype=torch.int8).expand(layout.micro_batch, seq)}
    replicas = [trained_sequences([microbatch] * layout.microbatches)
                for _ in range(layout.data_parallel)]
    tokens, squares = map(sum, zip(*replicas, strict=True))
    assert tokens == batch.tokens_per_step
    trainer = training_flops(FlopsShape.from_config(cfg), tokens, squares)
    assert batch.flops_per_token * batch.tokens_per_step == pytest.approx(trainer, rel=1e-12)


def _shape(**changes) -> FlopsShape:
    base = dict(hidden_size=8, padded_vocab_size=16, attention_layers=1, dense_mlp_layers=1,
                moe_layers=0, num_attention_heads=2, num_query_groups=2, kv_channels=4,
                ffn_hidden_size=32, gated=False)
    return FlopsShape(**{**base, **changes})


def test_causal_attention_is_half_of_all_position_pairs():
    shape = _shape()
    query = 2 * 4
    full = 2 * query + 2 * query  # QK^T and PV for every pair of positions, 2 FLOPs a MAC
    assert training_flops(shape, 10, 100) - 10 * 3 * forward_flops_per_token(shape) == (
        3 * full * 100 / 2)
    assert attention_score_flops(shape, 1) == full


def test_gqa_shrinks_only_the_key_value_projections():
    mha = forward_flops_per_token(_shape())
    gqa = forward_flops_per_token(_shape(num_query_groups=1))
    assert mha - gqa == 2 * 8 * (2 * 4)  # K and V of one group fewer, 8 wide -> 4 wide each


def test_swiglu_adds_a_third_mlp_matrix():
    gelu, swiglu = forward_flops_per_token(_shape()), forward_flops_per_token(_shape(gated=True))
    assert swiglu - gelu == 2 * 8 * 32


def test_moe_counts_routed_and_shared_experts_not_all_experts():
    top2 = _shape(dense_mlp_layers=0, moe_layers=1, moe_router_topk=2, moe_ffn_hidden_size=32)
    dense_twice = _shape(ffn_hidden_size=64)
    assert forward_flops_per_token(top2) == forward_flops_per_token(dense_twice)
    shared = _shape(dense_mlp_layers=0, moe_layers=1, moe_router_topk=2, moe_ffn_hidden_size=32,
                    moe_shared_ffn_hidden_size=32)
    dense_thrice = _shape(ffn_hidden_size=96)
    assert forward_flops_per_token(shared) == forward_flops_per_token(dense_thrice)


def test_latent_experts_equal_megatron_training_formula():
    """A latent MoE's routed experts run at the latent width behind two projections, as
    Megatron-LM counts them (`training.py:798-812`); the tiny Mixtral at latent 32 of 64."""
    from recipes.config.overrides import apply_overrides

    cfg = apply_overrides(get_recipe("mixtral_tiny_ep1"), ["model.moe_latent_size=32"])
    args = _megatron_args(cfg)
    args.moe_latent_size = 32
    theirs = num_floating_point_operations(args, cfg.train.global_batch_size)
    assert step_flops(cfg) == pytest.approx(theirs, rel=1e-12)
    assert step_flops(cfg) < step_flops(get_recipe("mixtral_tiny_ep1"))


def test_every_mtp_depth_counts_its_layers_projection_and_logits():
    """The tiny Super (MEM*EME/*E/*E): two depths of attention + latent MoE, each with its
    2·hidden -> hidden projection and the logits once more; a shared layer still runs twice
    (Megatron-LM's hybrid formula counts the depths' layers and logits but not the projection,
    `training.py:480-505, 853-858`). One depth counted by hand from the recipe's shape."""
    from recipes.config.overrides import apply_overrides

    cfg = get_recipe("super_tiny_dp1")
    main = apply_overrides(cfg, ["model.hybrid_layer_pattern=MEM*EME",
                                 "model.mtp_use_repeated_layer=false",
                                 "model.mtp_loss_scaling_factor=0.1"])
    m = cfg.model
    hidden, heads, groups, seq, vocab = 64, 4, 2, 128, 256
    head, topk, expert, latent, shared = 16, 2, 64, 32, 64
    assert (m.hidden_size, m.num_attention_heads, m.num_query_groups, m.seq_length) == (
        hidden, heads, groups, seq)
    assert (m.hidden_size // m.num_attention_heads, cfg.layout.padded_vocab) == (head, vocab)
    assert (m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_latent_size,
            m.moe_shared_expert_ffn_hidden_size, m.activation) == (
        topk, expert, latent, shared, "squared_relu")
    q, kv = heads * head, groups * head  # query width 64; K and V 32 wide each (GQA)
    depth = (
        2 * hidden * q  # Q projection
        + 2 * (2 * hidden * kv)  # K and V projections
        + 2 * q * hidden  # output projection
        + 2 * seq / 2 * (2 * q)  # QK^T and PV, a token attending to half its row of 128
        + topk * 2 * (2 * latent * expert)  # two routed experts at the latent width, 2 matrices
        + 2 * hidden * latent + 2 * latent * hidden  # into and out of the latent width
        + 2 * (2 * hidden * shared)  # the shared expert, two matrices (squared ReLU)
        + 2 * (2 * hidden) * hidden  # the depth's projection of [embedding; hidden state]
        + 2 * hidden * vocab  # the logits once more
    )
    assert depth == 131_072
    per_token = 3 * 2 * depth  # forward and backward (x3), two depths
    assert model_flops_per_token(cfg) - model_flops_per_token(main) == pytest.approx(per_token)
    s = FlopsShape.from_config(cfg)
    assert (s.attention_layers, s.moe_layers, s.mtp_depths) == (1 + 2, 3 + 2, 2)


def test_recomputation_is_not_useful_work():
    cfg = get_recipe("tiny_dp1")
    recomputing = copy.deepcopy(cfg)
    recomputing.train.recompute = "full"
    assert step_flops(recomputing) == step_flops(cfg) > 0


def test_tflops_per_gpu_divides_over_gpus_and_seconds():
    assert tflops_per_gpu(8e12, 2.0, 4) == 1.0

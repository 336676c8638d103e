"""The planner prices what Transformer Engine's linears save of their inputs under FP8 and NVFP4.

In a layer of the FP8/FP4 region a TE linear saves its input quantized (the column-wise copy)
instead of in BF16: the fused norms' outputs (QKV, dense fc1, Mamba in_proj inputs), fc2's and
out_proj's inputs, the routed experts' fc1 and fc2 inputs and the latent projections' inputs.
Core attention keeps its own BF16 output for its backward, so the output projection's quantized
copy comes beside it. Everything here is computed by hand from the tiny models' shapes.
"""

from __future__ import annotations

import pytest

from recipes.config.overrides import apply_overrides
from recipes.plan.activations import layer_bytes, stage_activations
from recipes.registry import get_recipe

BF16 = ["precision.dtype=bf16"]
TENSORWISE = [*BF16, "plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise"]
BLOCKWISE = [*BF16, "plugins.fp8.format=e4m3", "plugins.fp8.recipe=blockwise"]
MXFP8 = [*BF16, "plugins.fp8.format=hybrid", "plugins.fp8.recipe=mxfp8"]
NVFP4 = [*BF16, "plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4"]

# tiny_dp1: hidden 64, 4 heads (MHA, width 16), GELU MLP of 256, no dropout, 2 x 128 tokens, TP1.
H, QUERY, KV, FFN, TOKENS = 64, 64, 2 * 64, 256, 2 * 128
D = 2  # BF16
# Per token: norm + QKV inputs 2dh, Q/K/V d(q + kv), projection input d q, FP32 LSE 4 per head;
# MLP: norm + fc1 inputs 2dh, GELU input and output (fc2's input) 2d ffn.
BF16_LAYER = 2 * D * H + D * (QUERY + KV) + D * QUERY + 4 * 4 + 2 * D * H + 2 * D * FFN


def _gpt(*overrides: str, recipe: str = "tiny_dp1"):
    return apply_overrides(get_recipe(recipe), list(overrides))


def _fp8_layer(q: float) -> float:
    """One tiny GPT layer per token with the linears' inputs saved at `q` bytes an element: the
    BF16 figure less (d - q) for each input replaced (QKV, fc1 and fc2), and the projection's
    quantized copy beside core attention's BF16 output."""
    replaced = H + H + FFN  # QKV input, fc1 input (norm outputs), fc2 input (GELU output)
    return BF16_LAYER - (D - q) * replaced + q * QUERY


def test_a_bf16_run_is_priced_as_before() -> None:
    assert layer_bytes(_gpt(*BF16), "flash") == TOKENS * BF16_LAYER == TOKENS * 2064


def test_tensorwise_fp8_saves_the_linears_inputs_in_one_byte() -> None:
    fp8 = layer_bytes(_gpt(*TENSORWISE), "flash")
    assert fp8 == TOKENS * _fp8_layer(1) == TOKENS * (2064 - 64 - 64 - 256 + 64)
    delayed = _gpt(*BF16, "plugins.fp8.format=hybrid", "plugins.fp8.recipe=delayed")
    assert layer_bytes(delayed, "flash") == fp8  # one fp32 scale per tensor: not counted


@pytest.mark.parametrize("overrides", [BLOCKWISE, MXFP8])
def test_block_scales_are_counted(overrides) -> None:
    # blockwise: an fp32 scale per 1x128 tile; MXFP8: an E8M0 byte per 32 values
    q = 1 + 4 / 128 if "plugins.fp8.recipe=blockwise" in overrides else 1 + 1 / 32
    found = layer_bytes(_gpt(*overrides), "flash")
    assert found == pytest.approx(TOKENS * _fp8_layer(q))
    assert found > layer_bytes(_gpt(*TENSORWISE), "flash")


def test_nvfp4_holds_less_than_fp8() -> None:
    found = layer_bytes(_gpt(*NVFP4), "flash")  # half a byte and an E4M3 byte per 16 values
    assert found == pytest.approx(TOKENS * _fp8_layer(0.5 + 1 / 16))
    assert found < layer_bytes(_gpt(*TENSORWISE), "flash") < layer_bytes(_gpt(*BF16), "flash")


def test_bf16_end_layers_are_priced_in_bf16() -> None:
    ends = ["plugins.fp8.first_layers_bf16=1", "plugins.fp8.last_layers_bf16=1"]
    (stage,) = stage_activations(_gpt(*TENSORWISE, *ends), "flash", te_layers=True)
    assert stage.layers == 4
    assert stage.layers_total == pytest.approx(
        stage.in_flight * TOKENS * (2 * BF16_LAYER + 2 * _fp8_layer(1)))
    assert layer_bytes(_gpt(*TENSORWISE, *ends), "flash", low=False) == TOKENS * BF16_LAYER


def test_a_stage_counts_its_own_fp8_layers() -> None:
    # tiny_pp2 (tiny_dp1's model on PP2): two layers a stage, the first layer in BF16: stage 0
    # holds one FP8 layer, stage 1 two; each its layers' bytes times its micro-batches in flight.
    pp2 = [*TENSORWISE, "plugins.fp8.first_layers_bf16=1"]
    first, last = stage_activations(_gpt(*pp2, recipe="tiny_pp2"), "flash", te_layers=True)
    assert first.layers_total == pytest.approx(
        first.in_flight * TOKENS * (BF16_LAYER + _fp8_layer(1)))
    assert last.layers_total == pytest.approx(last.in_flight * TOKENS * 2 * _fp8_layer(1))
    bf16_first, bf16_last = stage_activations(_gpt(*BF16, recipe="tiny_pp2"), "flash",
                                              te_layers=True)
    assert bf16_first.layers_total == bf16_first.in_flight * TOKENS * 2 * BF16_LAYER
    assert bf16_last.layers_total == bf16_last.in_flight * TOKENS * 2 * BF16_LAYER


def test_layernorm_recompute_reaches_only_norms_of_their_own() -> None:
    """Transformer Engine's QKV and fc1 linears hold a dense layer's norms (the FP8 layers are
    TE's): `layernorm` recomputes nothing there; Megatron's local layers drop both norms'
    outputs, the QKV and fc1 inputs."""
    recompute = ["train.recompute=selective", "train.recompute_modules=[layernorm]"]
    fp8 = layer_bytes(_gpt(*TENSORWISE, *recompute), "flash", te_layers=True)
    assert fp8 == layer_bytes(_gpt(*TENSORWISE), "flash", te_layers=True) == TOKENS * (
        _fp8_layer(1))
    bf16 = layer_bytes(_gpt(*BF16, *recompute), "flash", te_layers=False)
    assert bf16 == TOKENS * (BF16_LAYER - D * (H + H))


def test_offloading_attention_moves_what_it_holds() -> None:
    # core_attn: Q, K, V and its own BF16 output; attn_proj: the projection's FP8 copy;
    # qkv_linear: the QKV linear's FP8 input and the BF16 input of the norm it holds.
    offload = ["train.offload_modules=[qkv_linear,core_attn,attn_proj]"]
    fp8 = layer_bytes(_gpt(*TENSORWISE, *offload), "flash")
    kept = _fp8_layer(1) - (D * H + 1 * H + D * (QUERY + KV) + D * QUERY + 1 * QUERY)
    assert fp8 == TOKENS * kept
    assert kept == 4 * 4 + D * H + 1 * H + D * FFN + 1 * FFN  # what stays on the GPU


def test_hybrid_layers_by_kind() -> None:
    # hybrid_tiny_dp1 (M*-ME-): Mamba saves in_proj's input (hidden) and out_proj's (inner);
    # an MoE layer's routed copies (top-2) save the experts' fc1 (hidden) and fc2 (ffn) inputs,
    # its own input stays BF16 (the router keeps it); a dense MLP as in a GPT layer.
    base = get_recipe("hybrid_tiny_dp1")
    m = base.model
    tokens = base.train.micro_batch_size * m.seq_length
    bf16, fp8 = apply_overrides(base, BF16), apply_overrides(base, TENSORWISE)
    inner = m.mamba_num_heads * m.mamba_head_dim if m.mamba_num_heads else 2 * m.hidden_size
    expected = {
        "M": (D - 1) * (m.hidden_size + inner),
        "E": m.moe_router_topk * (D - 1) * (m.hidden_size + m.moe_ffn_hidden_size),
        "-": (D - 1) * (m.hidden_size + m.ffn_hidden_size),
    }
    for symbol, saved in expected.items():
        assert layer_bytes(bf16, "flash", symbol=symbol) - layer_bytes(
            fp8, "flash", symbol=symbol) == pytest.approx(tokens * saved), symbol


def test_moe_act_recompute_drops_the_quantized_fc2_input() -> None:
    # Megatron has fc2 save the BF16 output the recompute discards (moe/experts.py:272-275):
    # nothing of it is held, so the FP8 layer drops exactly its one-byte fc2 inputs.
    base = get_recipe("hybrid_tiny_dp1")
    m = base.model
    tokens = base.train.micro_batch_size * m.seq_length
    recompute = ["train.recompute=selective", "train.recompute_modules=[moe_act]"]
    kept = layer_bytes(apply_overrides(base, [*TENSORWISE, *recompute]), "flash", symbol="E")
    full = layer_bytes(apply_overrides(base, TENSORWISE), "flash", symbol="E")
    assert full - kept == pytest.approx(tokens * m.moe_router_topk * 1 * m.moe_ffn_hidden_size)

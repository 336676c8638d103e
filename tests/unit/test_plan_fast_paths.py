"""The planner prices the GPU fast paths: selective recompute by module and activation offloading
take their tensors off the activations, CUDA graphs add their static buffers, TP and EP overlap
hide communication (test_plan_search.py), and the plan line says which are on with what each
saves or costs; on CPU ranks it names what runs without them."""

from __future__ import annotations

import dataclasses

import pytest

from recipes.config.overrides import apply_overrides
from recipes.plan.activations import cuda_graph_static_bytes, layer_bytes, stage_activations
from recipes.plan.fast_paths import fast_path_line, memory_effects
from recipes.registry import get_recipe

LLAMA = "llama3_8b_tp8_dp8"  # TP8 + SP, mbs 2, seq 8192, hidden 4096, ffn 14336, bf16


def _with(name: str, *overrides: str):
    return apply_overrides(get_recipe(name), list(overrides))


def _drop(name: str, *overrides: str, symbol=None, te_layers: bool = True) -> float:
    base = layer_bytes(get_recipe(name), "flash", symbol=symbol, te_layers=te_layers)
    return base - layer_bytes(_with(name, *overrides), "flash", symbol=symbol,
                              te_layers=te_layers)


TOKENS = 2 * 8192  # micro-batch x sequence
NORMS = ("train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]")


def test_layernorm_recompute_drops_the_norms_outputs_where_they_are_modules():
    """Megatron's local layers: the QKV input and the MLP input, 2 bytes x 4096 each per token,
    split by SP over TP8. Transformer Engine's layers fuse both norms into the next linear, and
    Megatron recomputes neither (`input_layernorm` / `pre_mlp_layernorm` are IdentityOp)."""
    scores = _drop(LLAMA, "train.recompute=selective")  # core_attn alone: the FP32 LSE
    assert _drop(LLAMA, *NORMS, te_layers=False) - scores == pytest.approx(
        TOKENS * 2 * 2 * 4096 / 8)
    assert _drop(LLAMA, *NORMS) == scores


def test_layernorm_recompute_on_te_layers_drops_an_moe_layers_own_norm():
    """Mixtral's MoE layers keep their pre-MLP norm a module (TENorm): its output, the
    router's input, 2 bytes x 4096 per token, is recomputed; the attention norm is fused."""
    name = "mixtral_8x7b_tp1_pp4_ep8_dp16"
    scores = _drop(name, "train.recompute=selective")
    assert _drop(name, *NORMS) - scores == pytest.approx(4096 * 2 * 4096)
    assert _drop(name, *NORMS, te_layers=False) - scores == pytest.approx(4096 * 2 * 2 * 4096)


def test_norm_offloading_follows_the_norm_modules():
    """qkv_linear moves the QKV input and, on TE's layers, the input of the norm it holds; there
    attn_norm and a dense layer's mlp_norm name no module and move nothing."""
    qkv = _drop(LLAMA, "train.offload_modules=[qkv_linear]")
    assert qkv == pytest.approx(TOKENS * 2 * 2 * 4096 / 8)
    assert _drop(LLAMA, "train.offload_modules=[qkv_linear]", te_layers=False) == (
        pytest.approx(qkv / 2))
    assert _drop(LLAMA, "train.offload_modules=[attn_norm]") == 0
    assert _drop(LLAMA, "train.offload_modules=[mlp_norm]") == 0
    name = "mixtral_8x7b_tp1_pp4_ep8_dp16"  # an MoE layer's TENorm: its input moves
    assert _drop(name, "train.offload_modules=[mlp_norm]") == pytest.approx(4096 * 2 * 4096)


def test_mlp_recompute_drops_the_inner_activations():
    """SwiGLU's gate and up outputs and the activation output: 3 x 14336 / TP8 bf16 values; on
    Transformer Engine's layers, whose FC1 holds the norm, the checkpoint starts at the norm's
    input and FC1's input (4096, split by SP) goes too."""
    mlp = ("train.recompute=selective", "train.recompute_modules=[mlp]")
    assert _drop(LLAMA, *mlp, te_layers=False) == pytest.approx(TOKENS * 2 * 3 * 14336 / 8)
    assert _drop(LLAMA, *mlp) == pytest.approx(TOKENS * 2 * (3 * 14336 + 4096) / 8)


def test_offloading_moves_the_named_inputs():
    """core_attn: Q, K, V (32 + 2 x 8 heads of 128, / TP8); attn_proj: its input (32 x 128)."""
    assert _drop(LLAMA, "train.offload_modules=[core_attn]") == pytest.approx(
        TOKENS * 2 * (4096 + 2 * 1024) / 8)
    assert _drop(LLAMA, "train.offload_modules=[core_attn,attn_proj]") == pytest.approx(
        TOKENS * 2 * (4096 + 2 * 1024 + 4096) / 8)


def test_moe_recompute_keeps_only_the_layers_input():
    """Mixtral-8x7B: top-2 copies of expert input, SwiGLU inner (3 x 14336) and output, and the
    FP32 router logits; moe_act only the activation's output (14336 per copy)."""
    name = "mixtral_8x7b_tp1_pp4_ep8_dp16"
    tokens = 4096
    whole = _drop(name, "train.recompute_modules=[core_attn,moe]")
    assert whole == pytest.approx(tokens * (2 * (2 * 4096 + 2 * 3 * 14336 + 2 * 4096) + 4 * 8))
    act = _drop(name, "train.recompute_modules=[core_attn,moe_act]")
    assert act == pytest.approx(tokens * 2 * 2 * 14336)


def test_a_latent_moe_recomputed_whole_keeps_only_its_input():
    """A latent MoE layer (the tiny Super's `E`) under `moe` recompute keeps what a recomputed
    layer keeps: its norm's input and the MoE input; its latent-wide routed copies, router
    logits and the latent projections' inputs all go. Offloading `expert_fc1` moves the
    latent-wide expert inputs."""
    cfg = _with("super_tiny_dp1", "train.recompute=selective", "train.recompute_modules=[moe]")
    m, d = cfg.model, 2 if cfg.precision.dtype == "bf16" else 4
    tokens = cfg.train.micro_batch_size * m.seq_length
    masks = m.hidden_size if m.hidden_dropout > 0 else 0
    assert layer_bytes(cfg, "flash", symbol="E") == pytest.approx(
        tokens * (2 * d * m.hidden_size + masks))
    offloaded = _with("super_tiny_dp1", "train.offload_modules=[expert_fc1]")
    plain = get_recipe("super_tiny_dp1")
    moved = layer_bytes(plain, "flash", symbol="E") - layer_bytes(offloaded, "flash", symbol="E")
    assert moved == pytest.approx(tokens * m.moe_router_topk * d * m.moe_latent_size)


def test_cuda_graphs_add_static_buffers_per_graphed_layer_and_captured_micro_batch():
    """Nemotron-H 56B graphs its Mamba layers: 4 x tokens x hidden bf16 (SP over TP8) each,
    one micro-batch captured without pipelining; with PP every micro-batch of the step."""
    cfg = get_recipe("nemotron_h_56b_tp8_sp_dp8")
    mamba = cfg.model.hybrid_layer_pattern.count("M")
    per_graph = 4 * 8192 * 8192 * 2 / 8
    assert cuda_graph_static_bytes(cfg, {"M": mamba, "-": 10}, mamba + 10) == mamba * per_graph
    stage = stage_activations(cfg, "flash", te_layers=True)[0]
    assert stage.cuda_graphs == mamba * per_graph
    assert stage.total == pytest.approx(
        stage_activations(_with(cfg.name, "train.cuda_graphs=none",
                                "train.cuda_graph_modules=[]"), "flash", te_layers=True)[0].total
        + mamba * per_graph)
    gpt = _with("llama3_8b_tp8_pp4_dp2", "train.cuda_graphs=transformer_engine",
                "train.cuda_graph_modules=[attn]")
    captured = gpt.layout.microbatches
    assert cuda_graph_static_bytes(gpt, None, 8) == 8 * captured * 4 * TOKENS * 4096 * 2 / 8


def test_the_plan_line_names_each_fast_path_with_its_memory():
    cfg = get_recipe("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16")
    effects = memory_effects(cfg, "flash", 0, te_layers=True)
    assert effects["recompute"] < 0 < effects["graphs"]
    line = fast_path_line(cfg, "flash", 0, on_gpu=True)
    assert line.startswith("fast paths: flex dispatcher (hybridep); grouped gemm; permute "
                           "fusion; fused squared relu; CUDA graphs (transformer_engine: attn, "
                           "mamba) costs ")
    assert "; TP comm overlap; selective recompute (moe, layernorm) saves " in line
    assert "off on CPU ranks" not in line


def test_on_cpu_ranks_the_line_says_what_is_off_there():
    cfg = dataclasses.replace(get_recipe("hybrid_tiny_dp1"))
    line = fast_path_line(cfg, "explicit", 0, on_gpu=False)
    assert line == "fast paths: grouped gemm (off on CPU ranks: grouped gemm)"
    dense = fast_path_line(get_recipe("tiny_dp1"), "explicit", 0, on_gpu=False)
    assert dense == "fast paths: none beyond the fusions"

"""Each rule Megatron Core or Transformer Engine asserts about a GPU fast path, fired alone before
any rank starts (recipes/config/fast_paths.py): one override on a recipe that breaks no rule,
exactly that rule fails, with its one line; and every such line reaches the user through
validation as a ConfigError."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config import fast_paths
from recipes.config.overrides import apply_overrides
from recipes.config.validation import failing_rules, validate
from recipes.registry import get_recipe

MIXTRAL = "mixtral_tiny_ep2_dp2"  # 4 experts, EP2, alltoall, SwiGLU
MIXTRAL_TP = "mixtral_tiny_tp2_sp_ep2_dp2"  # TP2 + SP, EP2
HYBRID = "hybrid_tiny_dp1"  # M*-ME-: every layer kind, squared ReLU, grouped GEMM experts
DENSE = "tiny_tp2_pp2"  # TP2 x PP2, GELU, no SP
EP_BF16 = ["precision.dtype=bf16"]
PACKED = ["data.source=blend", "data.blend=conf/data/python_stdlib.yaml", "data.documents=packed",
          "train.micro_batch_size=1"]

# (rule, recipe, overrides, the start of its one line)
CASES = [
    ("check_moe_fast_paths_need_experts", DENSE, ["model.moe_permute_fusion=true"],
     "model.moe_permute_fusion=true needs an MoE model"),
    ("check_moe_fast_paths_need_experts", DENSE, ["model.moe_token_dispatcher=flex"],
     "model.moe_token_dispatcher=flex needs an MoE model"),
    ("check_flex_backend_needs_flex", MIXTRAL, ["model.moe_flex_backend=hybridep"],
     "model.moe_flex_backend=hybridep is read only by the flex dispatcher"),
    ("check_flex_needs_expert_ranks", "mixtral_tiny_ep1", ["model.moe_token_dispatcher=flex",
                                                           "model.moe_flex_backend=deepep"],
     "model.moe_token_dispatcher=flex with model.moe_flex_backend=deepep exchanges tokens"),
    ("check_flex_on_gpus", MIXTRAL, ["model.moe_token_dispatcher=flex",
                                     "model.transformer_impl=local"],
     "model.moe_token_dispatcher=flex needs Transformer Engine's layers"),
    ("check_moe_kernels_need_transformer_engine", MIXTRAL,
     ["model.moe_permute_fusion=true", "model.transformer_impl=local"],
     "model.moe_permute_fusion=true is a Transformer Engine kernel"),
    ("check_hybrid_experts_are_grouped", HYBRID, ["model.moe_grouped_gemm=false"],
     "model.moe_grouped_gemm=false, but Megatron's hybrid layers"),
    ("check_shared_expert_overlap", MIXTRAL, ["model.moe_shared_expert_overlap=true"],
     "model.moe_shared_expert_overlap=true needs shared experts"),
    ("check_shared_expert_overlap", HYBRID, ["model.moe_shared_expert_overlap=true",
                                             "model.moe_token_dispatcher=allgather"],
     "model.moe_shared_expert_overlap=true works with the alltoall or flex dispatcher"),
    ("check_fused_squared_relu", MIXTRAL, ["model.moe_fused_squared_relu=true"],
     "model.moe_fused_squared_relu=true fuses squared ReLU, but model.activation=swiglu"),
    ("check_fused_squared_relu", "hf_tiny_nemotron_h", ["model.moe_fused_squared_relu=true",
                                                        "model.moe_grouped_gemm=false",
                                                        "model.transformer_impl=local"],
     "model.moe_fused_squared_relu=true runs inside the grouped-GEMM experts"),
    ("check_recompute_modules_known", DENSE, ["train.recompute=selective",
                                              "train.recompute_modules=[core_attn,mla_up_proj]"],
     "train.recompute_modules has 'mla_up_proj', not one of"),
    ("check_recompute_modules_known", DENSE, ["train.recompute=selective",
                                              "train.recompute_modules=[]"],
     "train.recompute_modules=[] recomputes nothing"),
    ("check_recompute_modules_need_selective", DENSE, ["train.recompute_modules=[mlp]"],
     "train.recompute_modules=['mlp'] is read only by selective recompute"),
    ("check_recompute_modules_match_layers", DENSE, ["train.recompute=selective",
                                                     "train.recompute_modules=[moe]"],
     "train.recompute_modules has moe, but the model has no MoE layer"),
    ("check_moe_act_recompute_needs_grouped_gemm", MIXTRAL,
     ["train.recompute=selective", "train.recompute_modules=[moe_act]"],
     "train.recompute_modules has moe_act"),
    ("check_mlp_recompute_without_linear_biases", DENSE,
     ["train.recompute=selective", "train.recompute_modules=[mlp]"],
     "train.recompute_modules has mlp with model.add_bias_linear=true"),
    ("check_offload_modules_known", DENSE, ["train.offload_modules=[embedding]"],
     "train.offload_modules has 'embedding', not one of"),
    ("check_offload_attention_projection", DENSE, ["train.offload_modules=[attn_proj]"],
     "train.offload_modules has attn_proj without core_attn"),
    ("check_offload_inside_recomputed_moe", HYBRID,
     ["train.recompute=selective", "train.recompute_modules=[moe]",
      "train.offload_modules=[moe_act]"],
     "train.offload_modules has moe_act while train.recompute_modules has moe"),
    ("check_offload_modules_match_layers", DENSE, ["train.offload_modules=[expert_fc1]"],
     "train.offload_modules has expert_fc1, but the model has no MoE layer"),
    ("check_offload_needs_transformer_engine", DENSE,
     ["train.offload_modules=[core_attn]", "model.transformer_impl=local"],
     "train.offload_modules needs Transformer Engine's layers"),
    ("check_offload_fused_norms", DENSE, ["train.offload_modules=[attn_norm]"],
     "train.offload_modules has attn_norm, but Transformer Engine's QKV linear holds the "
     "attention norm"),
    ("check_offload_fused_norms", DENSE, ["train.offload_modules=[mlp_norm]"],
     "train.offload_modules has mlp_norm, but Transformer Engine's FC1 holds a dense MLP's norm"),
    ("check_offload_fused_norms", MIXTRAL, ["train.cuda_graphs=transformer_engine",
                                            "train.cuda_graph_modules=[attn]",
                                            "train.offload_modules=[mlp_norm]"],
     "train.offload_modules has mlp_norm, which Megatron does not offload in an MoE layer while "
     "train.cuda_graph_modules has attn"),
    ("check_layernorm_recompute_under_graphs", DENSE,
     ["train.cuda_graphs=transformer_engine", "train.recompute=selective",
      "train.recompute_modules=[core_attn,layernorm]"],
     "train.recompute_modules has layernorm, but with train.cuda_graphs=transformer_engine the "
     "layers are Transformer Engine's"),
    ("check_layernorm_recompute_under_graphs", MIXTRAL,
     ["train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[moe_router]",
      "train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]"],
     "train.recompute_modules has layernorm, which Megatron does not recompute in an MoE layer "
     "whose router is graphed"),
    ("check_cuda_graph_modules_known", DENSE, ["train.cuda_graphs=transformer_engine",
                                               "train.cuda_graph_modules=[embedding]"],
     "train.cuda_graph_modules has 'embedding', not one of"),
    ("check_cuda_graph_modules_need_graphs", DENSE, ["train.cuda_graph_modules=[attn]"],
     "train.cuda_graph_modules=['attn'] is read only with CUDA graphs"),
    ("check_cuda_graph_module_pairs", HYBRID, ["train.cuda_graphs=transformer_engine",
                                               "train.cuda_graph_modules=[moe_preprocess]"],
     "train.cuda_graph_modules has moe_preprocess without moe_router"),
    ("check_cuda_graph_module_pairs", HYBRID, ["train.cuda_graphs=local",
                                               "train.cuda_graph_modules=[moe,moe_router]"],
     "train.cuda_graph_modules has both moe and moe_router"),
    ("check_cuda_graph_modules_match_layers", DENSE, ["train.cuda_graphs=transformer_engine",
                                                      "train.cuda_graph_modules=[mamba]"],
     "train.cuda_graph_modules has mamba, but the model has no Mamba layer"),
    ("check_cuda_graph_modules_match_layers", MIXTRAL, ["train.cuda_graphs=transformer_engine",
                                                        "train.cuda_graph_modules=[mlp]"],
     "train.cuda_graph_modules has mlp, but the model has no dense MLP layer"),
    ("check_cuda_graph_modules_match_layers", HYBRID, ["train.cuda_graphs=transformer_engine",
                                                       "train.cuda_graph_modules=[mlp]"],
     "train.cuda_graph_modules has mlp, which Megatron 0.19.2 refuses in a model with experts"),
    ("check_cuda_graph_modules_match_layers", MIXTRAL, ["train.cuda_graphs=transformer_engine",
                                                        "train.cuda_graph_modules=[moe]"],
     "train.cuda_graph_modules has moe, which Megatron graphs only"),
    ("check_cuda_graphs_with_full_recompute", DENSE, ["train.cuda_graphs=transformer_engine",
                                                      "train.recompute=full"],
     "train.cuda_graphs=transformer_engine cannot be used with train.recompute=full"),
    ("check_cuda_graphs_with_recompute_modules", HYBRID,
     ["train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[moe_router]",
      "train.recompute=selective", "train.recompute_modules=[moe]"],
     "train.recompute_modules has moe while train.cuda_graph_modules has moe_router"),
    ("check_cuda_graphs_with_recompute_modules", DENSE,
     ["train.cuda_graphs=transformer_engine", "train.recompute=selective",
      "model.attention_dropout=0.1"],
     "model.attention_dropout=0.1 cannot be recomputed inside a CUDA graph of attention"),
    ("check_cuda_graphs_with_recompute_modules", DENSE,
     ["train.cuda_graphs=transformer_engine", "train.recompute=selective",
      "train.recompute_modules=[mlp]", "model.hidden_dropout=0.1",
      "model.add_bias_linear=false"],
     "model.hidden_dropout=0.1 cannot be recomputed inside a CUDA graph of the MLP"),
    ("check_cuda_graphs_with_offloading", DENSE, ["train.cuda_graphs=local",
                                                  "train.offload_modules=[core_attn]"],
     "train.cuda_graphs=local takes activation offloading of expert_fc1 and moe_act only"),
    ("check_cuda_graphs_need_transformer_engine", DENSE,
     ["train.cuda_graphs=transformer_engine", "model.transformer_impl=local"],
     "train.cuda_graphs=transformer_engine needs Transformer Engine's layers"),
    ("check_te_graphs_with_packed_rows", HYBRID,
     [*PACKED, "train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[mamba]"],
     "train.cuda_graphs=transformer_engine graphs mamba, whose replay takes no packed rows'"),
    ("check_te_graphs_with_packed_rows", DENSE, [*PACKED, "train.cuda_graphs=transformer_engine"],
     "train.cuda_graphs=transformer_engine graphs whole layers"),
    ("check_tp_overlap_needs_sequence_parallel", DENSE, ["parallel.tp_comm_overlap=true"],
     "parallel.tp_comm_overlap=true overlaps sequence parallel's all-gathers"),
    ("check_tp_overlap_needs_transformer_engine", MIXTRAL_TP,
     ["parallel.tp_comm_overlap=true", "model.transformer_impl=local"],
     "parallel.tp_comm_overlap=true needs Transformer Engine's layers"),
    ("check_ep_overlap", "mixtral_tiny_ep1", ["parallel.ep_comm_overlap=true", *EP_BF16],
     "parallel.ep_comm_overlap=true needs expert parallelism"),
    ("check_ep_overlap", "hybrid_tiny_ep2_dp2", ["parallel.ep_comm_overlap=true", *EP_BF16],
     "parallel.ep_comm_overlap=true is built by Megatron's GPT model only"),
    ("check_ep_overlap", MIXTRAL, ["parallel.ep_comm_overlap=true", *EP_BF16,
                                   "model.moe_token_dispatcher=allgather"],
     "parallel.ep_comm_overlap=true needs the alltoall or flex dispatcher"),
    ("check_ep_overlap", "mixtral_tiny_pp2_ep2_dp2", ["parallel.ep_comm_overlap=true",
                                                      *EP_BF16],
     "parallel.ep_comm_overlap=true with parallel.pipeline > 1 needs interleaving"),
    ("check_ep_overlap", MIXTRAL, ["parallel.ep_comm_overlap=true", *EP_BF16,
                                   "train.recompute=full"],
     "parallel.ep_comm_overlap=true cannot recompute the MoE layer"),
    ("check_ep_overlap", MIXTRAL, ["parallel.ep_comm_overlap=true"],
     "parallel.ep_comm_overlap=true needs bf16 or fp16"),
    ("check_ep_overlap", MIXTRAL, ["parallel.ep_comm_overlap=true", *EP_BF16,
                                   "train.cuda_graphs=transformer_engine"],
     "parallel.ep_comm_overlap=true cannot run inside Transformer Engine's graph"),
    ("check_ep_overlap_with_fsdp_graphs", MIXTRAL, [
        "parallel.ep_comm_overlap=true", *EP_BF16, "optimizer.distributed=true",
        "optimizer.fsdp=optim_grads_params", "train.cuda_graphs=transformer_engine",
        "train.cuda_graph_modules=[attn]"],
     "parallel.ep_comm_overlap=true under Megatron FSDP (optimizer.fsdp=optim_grads_params) "
     "takes no per-layer CUDA graphs"),
]


def test_every_rule_has_a_case():
    assert {rule.__name__ for rule in fast_paths.RULES} == {case[0] for case in CASES}


@pytest.mark.parametrize(("rule", "recipe", "overrides", "line"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_fires_alone(rule, recipe, overrides, line):
    base = get_recipe(recipe)
    assert failing_rules(base) == []
    cfg = apply_overrides(base, overrides)
    assert failing_rules(cfg) == [rule]
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    message = str(caught.value)
    assert message.startswith(line), message
    assert "\n" not in message


def test_the_shared_expert_overlap_with_ep_overlap_is_refused():
    cfg = apply_overrides(get_recipe("mixtral_tiny_ep2_dp2"), [
        "model.moe_shared_expert_ffn_hidden_size=64", "model.moe_shared_expert_overlap=true",
        "parallel.ep_comm_overlap=true", *EP_BF16])
    assert failing_rules(cfg) == ["check_ep_overlap"]
    assert "replaces model.moe_shared_expert_overlap" in fast_paths.check_ep_overlap(cfg)


def test_a_valid_combination_passes_every_rule():
    """Bridge's Nemotron 3 Nano fast paths on the tiny hybrid, EP2: flex (HybridEP), fusions,
    graphs of attention and Mamba, selective recompute of the MoE layer and norms."""
    cfg = apply_overrides(get_recipe("hybrid_tiny_ep2_dp2"), [
        "model.moe_token_dispatcher=flex", "model.moe_flex_backend=hybridep",
        "model.moe_permute_fusion=true", "model.moe_fused_squared_relu=true",
        "train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[attn,mamba]",
        "train.recompute=selective", "train.recompute_modules=[moe,layernorm]",
        "train.offload_modules=[core_attn,attn_proj]"])
    assert failing_rules(cfg) == []
    assert fast_paths.fast_paths_on(cfg) == [
        "flex dispatcher (hybridep)", "grouped gemm", "permute fusion", "fused squared relu",
        "CUDA graphs (transformer_engine: attn, mamba)", "selective recompute (moe, layernorm)",
        "activation offloading (core_attn, attn_proj)"]
    assert fast_paths.off_on_cpu(cfg, on_gpu=False) == fast_paths.fast_paths_on(cfg)[:-2] + [
        "activation offloading (core_attn, attn_proj)"]
    assert fast_paths.off_on_cpu(cfg, on_gpu=True) == []



def test_an_moe_layers_own_norm_may_be_recomputed_and_offloaded():
    """The MoE layer's pre-MLP norm is a module of its own on Transformer Engine's layers:
    recomputed beside a graphed router when the preprocess is graphed too with the alltoall
    dispatcher (transformer_layer.py:479-487), offloaded when no graph holds attention or the
    router."""
    graphed = ["train.cuda_graphs=transformer_engine",
               "train.cuda_graph_modules=[moe_router,moe_preprocess]"]
    recompute = ["train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]"]
    assert failing_rules(apply_overrides(get_recipe(MIXTRAL), [*graphed, *recompute])) == []
    assert failing_rules(apply_overrides(get_recipe(MIXTRAL), [
        *recompute, "train.offload_modules=[mlp_norm,qkv_linear]"])) == []


def test_te_graphs_of_other_modules_take_packed_rows():
    """Attention outside the graph gets its packed rows (transformer_layer.py:1217-1223)."""
    cfg = apply_overrides(get_recipe(HYBRID), [*PACKED, "train.cuda_graphs=transformer_engine",
                                               "train.cuda_graph_modules=[moe_router]"])
    assert fast_paths.check_te_graphs_with_packed_rows(cfg) is None


def test_a_phase_of_packed_rows_under_te_graphs_is_refused_before_launch():
    cfg = apply_overrides(get_recipe("nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16"), [
        "train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[attn,mamba]"])
    with pytest.raises(ConfigError, match=r"phases\[2\] \(long_context\): train.cuda_graphs="
                                          r"transformer_engine graphs attn, mamba"):
        validate(cfg)


def test_hybridep_is_taken_on_one_expert_rank():
    """Megatron asserts TPxEP > 1 for DeepEP only (token_dispatcher.py:1770, 1779-1786)."""
    cfg = apply_overrides(get_recipe("mixtral_tiny_ep1"), ["model.moe_token_dispatcher=flex",
                                                           "model.moe_flex_backend=hybridep"])
    assert fast_paths.check_flex_needs_expert_ranks(cfg) is None


def test_megatrons_own_graphs_take_moe_preprocess_alone():
    """With cuda_graph_impl=local Megatron adds moe_router itself (transformer_config.py:
    2472-2482)."""
    cfg = apply_overrides(get_recipe(HYBRID), ["train.cuda_graphs=local",
                                               "train.cuda_graph_modules=[moe_preprocess]"])
    assert fast_paths.check_cuda_graph_module_pairs(cfg) is None
    both = apply_overrides(get_recipe(HYBRID), ["train.cuda_graphs=local",
                                                "train.cuda_graph_modules=[moe,moe_preprocess]"])
    assert fast_paths.check_cuda_graph_module_pairs(both).startswith(
        "train.cuda_graph_modules has both moe and moe_preprocess")

"""The planner prices FP8 and NVFP4 parameters, and only them: Nemotron-4's rotary share and
LayerNorm1p change no byte.

With `plugins.fp8.param_gather` the GEMM weights of every layer outside the BF16 ends are held
in one byte (no BF16 copy) and all-gathered over DP in one byte. Checked: which layers Megatron
numbers where (virtual stages first), that the GEMM weights are exactly the linear weights of the
real Megatron model (built on one CPU rank; the embedding and output layer excluded), and the
bytes a plan saves in weights and in the DP all-gather.
"""

from __future__ import annotations

import dataclasses

import pytest

from recipes.config.overrides import apply_overrides
from recipes.models.counts import ParamCount
from recipes.plan.build import make_plan
from recipes.plan.cluster import load_cluster
from recipes.plan.gemm_weights import stage_layer_numbers, stage_low_precision_weights
from recipes.registry import get_recipe
from tests.one_rank_world import one_rank_world

CLUSTER = load_cluster("conf/cluster/h200_1x8.yaml")
FP8_PARAMS = ["precision.dtype=bf16", "plugins.fp8.format=hybrid",
              "plugins.fp8.recipe=tensorwise", "plugins.fp8.param_gather=true",
              "optimizer.distributed=true"]


def test_layers_are_numbered_virtual_stage_first() -> None:
    gpt = apply_overrides(get_recipe("tiny_pp2"), ["model.num_layers=8",
                                                   "parallel.virtual_pipeline=2"])
    assert [[n for n, _ in stage] for stage in stage_layer_numbers(gpt)] == [
        [0, 1, 4, 5], [2, 3, 6, 7]]
    hybrid = get_recipe("hybrid_tiny_pp2_vpp2")  # segments M* | -M | E | -
    assert stage_layer_numbers(hybrid) == [[(0, "M"), (1, "*"), (4, "E")],
                                           [(2, "-"), (3, "M"), (5, "-")]]


def test_the_bf16_end_layers_keep_their_weights() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), [*FP8_PARAMS,
                                                   "plugins.fp8.first_layers_bf16=1",
                                                   "plugins.fp8.last_layers_bf16=2"])
    every = apply_overrides(get_recipe("tiny_dp1"), FP8_PARAMS)
    (kept,), (all_four,) = stage_low_precision_weights(cfg), stage_low_precision_weights(every)
    assert kept.tp_split * 4 == all_four.tp_split  # one of the four layers in FP8
    off = apply_overrides(get_recipe("tiny_dp1"), FP8_PARAMS[:3])  # FP8, no FP8 parameters
    assert stage_low_precision_weights(off) == [ParamCount()]


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo world with Megatron's process groups, torn down after the test."""
    with one_rank_world(tmp_path) as initialize:
        yield initialize


def _linear_weights(model) -> int:
    """Elements of every linear layer's weight (Megatron's local linears stand where
    Transformer Engine's are on GPUs), the output layer excepted."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    return sum(module.weight.numel() for name, module in model.named_modules()
               if isinstance(module, ColumnParallelLinear | RowParallelLinear)
               and name != "output_layer")


# GPT with MoE layers and a shared expert; a hybrid of attention and MLP layers (a Mamba layer's
# in_proj and out_proj are the terms `recipes/models/hybrid/params.py` counts, which
# tests/unit/test_plan_params.py holds equal to the real model; its MoE layers route with an
# expert bias, a CUDA buffer, as does the all-to-all dispatcher: so not built here, the
# all-gather one has the same weights).
ALLGATHER = "model.moe_token_dispatcher=allgather"


@pytest.mark.parametrize(("recipe", "overrides"), [
    ("tiny_dp1", []),
    ("tiny_dp1", ["model.num_moe_experts=4", "model.add_bias_linear=false",
                  "model.moe_shared_expert_ffn_hidden_size=64", ALLGATHER]),
    ("hybrid_tiny_dp1", ["model.hybrid_layer_pattern='*-*--*'"]),
])
def test_gemm_weights_are_the_real_models_linear_weights(one_rank, recipe, overrides) -> None:
    from plugins.protocol.hooks import PluginSet
    from trainer.mcore_translation import build_transformer_config
    from trainer.model import build_model_chunks

    cfg = apply_overrides(get_recipe(recipe), [*overrides, *FP8_PARAMS])
    one_rank(cfg)
    plain = dataclasses.replace(cfg, plugins=get_recipe(recipe).plugins)  # no FP8 to build
    model = build_model_chunks(plain, build_transformer_config(plain, cpu_initialization=True),
                               PluginSet())[0]
    (low,) = stage_low_precision_weights(cfg)
    assert low.total == _linear_weights(model)


def _dp_gather(stage) -> float:
    """The bytes of the stage's DP weight all-gather (the gradients' reduce is its own row)."""
    (gather,) = [t for t in stage.traffic if t.group == "dp-cp" and t.weights]
    return gather.bytes_sent


def test_fp8_parameters_save_a_byte_per_weight_and_on_the_gather() -> None:
    bf16 = apply_overrides(get_recipe("nemotron_h_56b_tp8_sp_dp8"),
                           ["plugins.fp8.format=null", "plugins.fp8.recipe=delayed",
                            "plugins.fp8.first_layers_bf16=0", "plugins.fp8.last_layers_bf16=0",
                            "plugins.fp8.param_gather=false"])
    fp8 = apply_overrides(bf16, [*FP8_PARAMS, "plugins.fp8.first_layers_bf16=2",
                                 "plugins.fp8.last_layers_bf16=2"])
    (low,) = stage_low_precision_weights(fp8)
    before, after = make_plan(bf16, CLUSTER).worst, make_plan(fp8, CLUSTER).worst
    assert before.state.weights - after.state.weights == low.total  # 2 bytes -> 1
    assert (before.state.grads, before.state.master) == (after.state.grads, after.state.master)
    gather = _dp_gather(before) - _dp_gather(after)
    dp = bf16.layout.data_parallel
    assert gather == pytest.approx(low.dense * (dp - 1) / dp)


NVFP4_PARAMS = ["precision.dtype=bf16", "plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4",
                "plugins.fp8.param_gather=true", "optimizer.distributed=true"]


def test_nvfp4_parameters_save_a_byte_and_a_half_per_weight_and_on_the_gather() -> None:
    """Half a byte a weight in the DDP buffer and the all-gather; planned on a cluster whose
    GPUs have an FP4 peak (the step time's, not the memory's)."""
    from plugins.protocol.errors import ConfigError

    blackwell = dataclasses.replace(CLUSTER, peak_tflops={**CLUSTER.peak_tflops, "fp4": 1.0})
    bf16 = apply_overrides(get_recipe("super_tiny_dp2_distopt"), ["precision.dtype=bf16"])
    nvfp4 = apply_overrides(bf16, [*NVFP4_PARAMS, "plugins.fp8.last_layers_bf16=1"])
    (low,) = stage_low_precision_weights(nvfp4)
    every = stage_low_precision_weights(apply_overrides(bf16, NVFP4_PARAMS))[0]
    assert 0 < low.total < every.total  # the last layer (E) keeps its weights in BF16
    before, after = make_plan(bf16, blackwell).worst, make_plan(nvfp4, blackwell).worst
    assert before.state.weights - after.state.weights == pytest.approx(1.5 * low.total)
    gather = _dp_gather(before) - _dp_gather(after)
    assert gather == pytest.approx(1.5 * low.dense / 2)  # DP2: half of it travels
    with pytest.raises(ConfigError, match="gives no peak_tflops.fp4: its GPUs run no FP4 GEMMs"):
        make_plan(nvfp4, CLUSTER)  # H200: no FP4


def test_nvfp4_without_a_cluster_file_plans_its_memory_with_the_step_time_unknown() -> None:
    """A recipe that names no cluster file is planned on peaks the H100 file lends: an NVFP4
    run then fits or not by its memory, its time unknown (pretrain.py's pre-flight, a dry run);
    its own `cluster.spec` gives the peak; the search, which ranks by time, says it needs one."""
    from plugins.protocol.errors import ConfigError
    from recipes.plan.cluster import recipe_cluster
    from recipes.plan.search import search

    nvfp4 = apply_overrides(get_recipe("super_tiny_dp2_distopt"),
                            ["precision.dtype=bf16", *NVFP4_PARAMS])
    lent = recipe_cluster(nvfp4)
    assert lent.peaks_assumed and "fp4" not in lent.peak_tflops
    plan = make_plan(nvfp4, lent)
    assert plan.worst.peak > 0 and plan.batch.step_seconds is None
    with pytest.raises(ConfigError, match="the search times layouts at the GPUs' peak"):
        search(nvfp4, lent)
    named = recipe_cluster(apply_overrides(nvfp4, ["cluster.spec=conf/cluster/h200_1x8.yaml"]))
    assert not named.peaks_assumed and named.name == "recipe (h200_1x8 network)"
    with pytest.raises(ConfigError, match="gives no peak_tflops.fp4"):
        make_plan(nvfp4, named)  # a file the user named: refused, as before


def test_a_latent_moe_layer_counts_its_projections_among_its_gemm_weights() -> None:
    from recipes.models.moe.params import moe_gemm_weights, moe_mlp_params

    cfg = get_recipe("super_tiny_dp1")  # hidden 64, latent 32, 4 experts of 64, shared 64
    m, layout = cfg.model, cfg.layout
    gemm, params = moe_gemm_weights(m, layout), moe_mlp_params(m, layout)
    assert gemm.replicated == 2 * 64 * 32  # fc1_latent_proj and fc2_latent_proj
    assert gemm.expert == 4 * (64 * 32 + 32 * 64)  # each expert reads and writes 32 wide
    assert params.replicated == gemm.replicated + 4 * 64 + 64  # + router and norm


@pytest.mark.parametrize("override", ["model.rotary_percent=0.5",
                                      "model.layernorm_zero_centered_gamma=true"])
def test_rotary_share_and_layernorm1p_change_no_byte(override) -> None:
    cfg = get_recipe("tiny_tp2_pp2")
    changed = apply_overrides(cfg, [override])
    before, after = make_plan(cfg, CLUSTER), make_plan(changed, CLUSTER)
    assert [s.peak for s in before.stages] == [s.peak for s in after.stages]
    assert [s.traffic for s in before.stages] == [s.traffic for s in after.stages]

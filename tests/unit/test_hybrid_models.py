"""Hybrid Mamba-Transformer models: the pattern's stage split, the planner's counts by layer
kind, the FLOPs of a Mamba layer and its CP all-to-alls, the translation into Megatron, and
the GPU kernel refusal.

The meta-device builds of every hybrid recipe, rank for rank against these counts, are in
test_dry_run.py and test_plan_params.py (every registered recipe).
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError, UserError
from recipes.config.machine import MachineInfo, check_machine
from recipes.models.hybrid.flops import mamba_flops
from recipes.plan.build import make_plan
from recipes.plan.cluster import recipe_cluster
from recipes.plan.flops import FlopsShape, model_flops_per_token
from recipes.plan.params import active_parameters, model_parameters, symbol_params
from recipes.registry import get_recipe

NANO = "nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16"
SUPER = "nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"


def test_nemotron3_nano_totals_its_published_parameters() -> None:
    cfg = get_recipe(NANO)
    assert model_parameters(cfg) == 31_577_937_344  # published 31.6B
    assert active_parameters(cfg) == 3_580_073_408  # published ~3.6B (top-6 of 128 experts)


def test_nemotron3_super_totals_its_published_parameters() -> None:
    """NVIDIA's docs: 120.6B parameters, 12.7B active (docs/nemotron/super3/pretrain.md:15).
    Ours with the stored MTP depth (attention + a latent MoE layer: 2.94B); without it the
    decoder's own, which the published figures are."""
    from recipes.config.overrides import apply_overrides

    cfg = get_recipe(SUPER)
    assert model_parameters(cfg) == 123_611_012_096
    assert active_parameters(cfg) == 13_015_079_936  # top-22 of 512 latent experts
    main = cfg.model.hybrid_layer_pattern.split("/")[0]
    decoder = apply_overrides(cfg, [f"model.hybrid_layer_pattern={main}",
                                    "model.mtp_use_repeated_layer=false",
                                    "model.mtp_loss_scaling_factor=0.1"])
    assert model_parameters(decoder) == 120_668_687_360  # published 120.6B
    assert active_parameters(decoder) == 12_770_216_960  # published 12.7B
    assert abs(model_parameters(decoder) / 120.6e9 - 1) < 0.001
    assert abs(active_parameters(decoder) / 12.7e9 - 1) < 0.01


def test_nemotron3_super_keeps_its_published_pretraining_run() -> None:
    """NVIDIA's docs and stage-0 configs: 25T tokens (993,404 steps) at 3072 x 8192, WSD
    4.5e-4 -> 4.5e-6 with 7,949 warm-up steps (200B tokens) and a minus-sqrt decay over the
    final 198,682 (5T), weight decay 0.1, MTP loss x 0.3 over two depths sharing a layer,
    latent 1024; the layout TP4 + SP as published, EP64 where NVIDIA's main run had EP8."""
    cfg = get_recipe(SUPER)
    m, p, t, s = cfg.model, cfg.parallel, cfg.train, cfg.scheduler
    assert (p.tensor, p.sequence_parallel, p.expert, p.expert_tensor) == (4, True, 64, 1)
    assert (m.seq_length, t.global_batch_size, t.train_iters) == (8192, 3072, 993_404)
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, s.warmup_iters) == (4.5e-4, 4.5e-6, 7949)
    assert (s.style, s.wsd_decay_style, s.decay_iters, s.wsd_decay_iters) == (
        "wsd", "minus_sqrt", 992_411, 198_682)
    assert (m.moe_latent_size, m.num_moe_experts, m.moe_router_topk) == (1024, 512, 22)
    assert (m.mtp_loss_scaling_factor, m.mtp_use_repeated_layer) == (0.3, True)
    assert m.hybrid_layer_pattern.endswith("E/*E/*E") and m.num_layers == 88
    phases = get_recipe("nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16").phases
    assert [(ph.name, ph.end_step, ph.seq_length) for ph in phases] == [
        ("diverse", 794_723, 8192), ("quality", 993_404, 8192),
        ("long_context_1m", 995_431, 1_048_576), ("long_context_mixed", 996_445, 1_048_576)]


def test_nemotron3_nano_keeps_its_published_pretraining_run() -> None:
    """Model card and NVIDIA's docs: 25T tokens at 3072 x 8192, WSD 1e-3 -> 1e-5 decaying
    (cosine) over the final 5T, 333 warm-up steps (8.4B tokens), weight decay 0.1; Bridge's
    init std 0.0173 and layout (TP4 + SP, EP8)."""
    cfg = get_recipe(NANO)
    p, t, s = cfg.parallel, cfg.train, cfg.scheduler
    assert (p.tensor, p.sequence_parallel, p.expert, p.pipeline) == (4, True, 8, 1)
    assert (cfg.model.seq_length, t.global_batch_size, t.micro_batch_size) == (8192, 3072, 2)
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, s.warmup_iters) == (1e-3, 1e-5, 333)
    assert (s.style, s.wsd_decay_style, s.wsd_decay_iters) == ("wsd", "cosine", 198_682)
    assert abs(t.train_iters * 3072 * 8192 - 25e12) < 3072 * 8192
    assert (cfg.optimizer.weight_decay, cfg.precision.dtype) == (0.1, "bf16")
    assert cfg.model.init_method_std == 0.0173 and cfg.optimizer.distributed


def test_a_mamba_layer_counts_what_the_mixer_allocates() -> None:
    """Nemotron 3 Nano's Mamba layer by hand: 64 heads x 64 = d_inner 4096, 8 groups x state
    128 (B and C: 2048), conv width 4, hidden 2688."""
    cfg = get_recipe(NANO)
    cfg.parallel.tensor = 1
    in_proj = 2688 * (2 * 4096 + 2048 + 64)
    conv = (4096 + 2048) * 4 + (4096 + 2048)
    per_head = 3 * 64  # dt_bias, A_log, D
    count = symbol_params(cfg, "M")
    assert count.tp_split == in_proj + conv + per_head + 4096 + 4096 * 2688
    assert count.replicated == 2688  # the layer's RMSNorm


def test_tensor_parallel_splits_every_mamba_weight_but_the_norm() -> None:
    cfg = get_recipe(NANO)
    whole = symbol_params(cfg, "M")  # TP4 as configured
    cfg.parallel.tensor = 1
    single = symbol_params(cfg, "M")
    assert whole.tp_split * 4 == single.tp_split and whole.replicated == single.replicated


@pytest.mark.parametrize(("recipe", "chunks"), [
    ("hybrid_tiny_dp1", [["M*-ME-"]]),
    ("hybrid_tiny_pp2", [["M*-"], ["ME-"]]),  # no '|': an even split
    ("hybrid_tiny_pp2_pipes", [["M*-M"], ["E-"]]),  # '|': where the pattern cuts
    ("hybrid_tiny_pp2_vpp2", [["M*", "E"], ["-M", "-"]]),  # segment vp x PP + pp
])
def test_layout_hands_out_segments_as_megatron_does(recipe, chunks) -> None:
    layout = get_recipe(recipe).layout
    assert layout.chunk_patterns() == chunks
    assert layout.chunk_layers() == [[len(c) for c in stage] for stage in chunks]
    assert layout.stage_layers() == [sum(len(c) for c in stage) for stage in chunks]


def test_a_hybrid_counts_its_layers_by_kind() -> None:
    shape = FlopsShape.from_config(get_recipe(NANO))
    assert (shape.mamba_layers, shape.moe_layers, shape.attention_layers,
            shape.dense_mlp_layers) == (23, 23, 6, 0)
    assert shape.moe_shared_ffn_hidden_size == 3712


def test_mamba_flops_are_projections_and_the_chunked_scan() -> None:
    shape = FlopsShape.from_config(get_recipe(NANO))
    projections = 2 * 2688 * (2 * 4096 + 2048 + 64) + 2 * 4096 * 2688
    scan = 128 * (8 * 128 + 4096) + 4 * 4096 * 128
    assert mamba_flops(shape) == projections + scan


@pytest.mark.parametrize(("tensor", "per_layer_micro_batch"), [
    # z 128 + x 128 + B 32 + C 32 + dt 8 in, y 128 out: 456 values a token.
    (1, 456),
    # Per TP rank z 64 + x 64, one group for two CP ranks: B and C repeated twice (16 x 2
    # each), dt 4, y 64: 260 values a token.
    (2, 260),
])
def test_mamba_context_parallel_all_to_all_bytes(tensor, per_layer_micro_batch) -> None:
    """The tiny hybrid (Mamba heads 8 x 16, 2 groups, state 16; 2 Mamba layers) at CP2, fp32:
    128 tokens a rank (micro-batch 2 x 128 / CP2), half of each all-to-all leaves the rank,
    forward and backward, 4 micro-batches a step."""
    cfg = get_recipe("hybrid_tiny_dp1")
    cfg.parallel.context, cfg.parallel.tensor = 2, tensor
    cfg.parallel.sequence_parallel = tensor > 1
    cfg.cluster.gpus_per_node = 2 * tensor
    [stage] = make_plan(cfg, recipe_cluster(cfg)).stages
    [mamba] = [t for t in stage.traffic if t.operation == "Mamba all-to-all"]
    assert mamba.group == "cp"
    assert mamba.bytes_sent == 128 * per_layer_micro_batch * 4 / 2 * 2 * 2 * 4


def test_moe_flops_follow_the_active_experts_not_all() -> None:
    cfg = get_recipe(NANO)
    base = model_flops_per_token(cfg)
    cfg.model.num_moe_experts = 256  # more experts, same top-6: same work per token
    assert model_flops_per_token(cfg) == base


def test_hybrid_fields_reach_megatron() -> None:
    from trainer.mcore_translation import build_transformer_config

    config = build_transformer_config(get_recipe(NANO), cpu_initialization=True,
                                      meta_device=True)
    assert config.is_hybrid_model and config.mamba_num_heads == 64
    assert (config.mamba_head_dim, config.mamba_num_groups, config.mamba_state_dim) == (64, 8, 128)
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.moe_router_load_balancing_type == "seq_aux_loss"
    assert config.moe_aux_loss_coeff == 1e-4 and config.moe_router_topk_scaling_factor == 2.5
    assert config.moe_router_dtype == "fp32"
    assert config.moe_shared_expert_intermediate_size == 3712


def test_gpt_configs_get_no_hybrid_fields() -> None:
    from trainer.mcore_translation import build_transformer_config

    config = build_transformer_config(get_recipe("mixtral_tiny_ep1"), cpu_initialization=True)
    assert not config.is_hybrid_model and config.mamba_num_heads is None
    assert config.moe_router_score_function == "softmax" and config.moe_router_dtype is None
    assert config.moe_router_load_balancing_type == "aux_loss"


GPU_NODE = dict(gpus=4, launched_world_size=None, compute_capability=(9, 0),
                transformer_engine="2.9")


def test_gpu_ranks_without_mamba_kernels_are_refused_before_launch() -> None:
    cfg = get_recipe("hybrid_tiny_tp2_sp")
    cfg.cluster.gpus_per_node = 4
    cfg.train.global_batch_size = 8
    machine = MachineInfo(**GPU_NODE, missing_mamba_kernels=("mamba-ssm",))
    with pytest.raises(ConfigError, match="need mamba-ssm, not installed here; install the gpu"):
        check_machine(cfg, machine)
    check_machine(cfg, MachineInfo(**GPU_NODE))  # with them: accepted


def test_cpu_ranks_need_no_mamba_kernels() -> None:
    cfg = get_recipe("hybrid_tiny_dp1")
    check_machine(cfg, MachineInfo(gpus=0, launched_world_size=None,
                                   missing_mamba_kernels=("mamba-ssm", "causal-conv1d")))


def test_packed_rows_with_mamba_context_parallel_need_transformer_engine() -> None:
    cfg = get_recipe("hybrid_tiny_dp1")
    cfg.parallel.context, cfg.cluster.gpus_per_node = 2, 2
    cpu = MachineInfo(gpus=0, launched_world_size=None)
    check_machine(cfg, cpu)  # unpacked rows: Megatron's Mamba CP runs on CPU ranks
    cfg.data.source, cfg.data.blend = "blend", "conf/data/python_stdlib.yaml"
    check_machine(cfg, cpu)  # a blend concatenated: no packed rows either
    cfg.data.documents, cfg.train.micro_batch_size = "packed", 1
    with pytest.raises(ConfigError, match=r"^data.documents=packed \(packed rows\) with "
                       r"parallel.context=2 and Mamba layers needs Transformer Engine on GPU "
                       r"ranks .*; set parallel.context=1, or data.documents=concatenate, or run "
                       r"on GPUs with the gpu extra$"):
        check_machine(cfg, cpu)
    check_machine(cfg, MachineInfo(gpus=2, launched_world_size=None, transformer_engine="2.9"))


def test_a_gpu_rank_without_mamba_kernels_is_refused_in_one_line(monkeypatch) -> None:
    from trainer.models.hybrid import spec as hybrid_spec

    monkeypatch.setattr(hybrid_spec, "missing_mamba_kernels", lambda: ("causal-conv1d",))
    with pytest.raises(UserError, match="on GPUs need causal-conv1d"):
        hybrid_spec.hybrid_stack_spec(get_recipe("hybrid_tiny_dp1"), transformer_engine=True)

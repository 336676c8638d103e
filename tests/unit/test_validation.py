"""Each validation rule: one broken field triggers exactly that rule; its message gives the fix."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.config.validation import RULES, all_rules, failing_rules, validate
from recipes.registry import get_recipe
from tests.unit.test_fast_path_rules import CASES as FAST_PATH_RULE_CASES
from tests.unit.test_phases import PHASE_RULE_CASES
from tests.unit.test_rampup import RAMPUP_RULE_CASES

MOE_NO_BIAS = ["model.add_bias_linear=false", "model.moe_router_topk=2"]
HYBRID = "hybrid_tiny_dp1"  # M*-ME-: Mamba heads 8 x 16 in 2 groups, 4 experts
SUPER = "super_tiny_dp1"  # MEM*EME/*E/*E: latent MoE (32 of 64), two shared MTP depths
NO_MTP = ["model.mtp_use_repeated_layer=false", "model.mtp_loss_scaling_factor=0.1"]
DENSE_HYBRID = ["model.hybrid_layer_pattern=M*-M--", "model.num_moe_experts=null",
                "model.moe_router_expert_bias=false", "model.moe_router_score_function=softmax",
                "model.moe_router_topk_scaling_factor=null",
                "model.moe_shared_expert_ffn_hidden_size=null",
                "model.moe_load_balancing=aux_loss", "model.moe_grouped_gemm=false"]

# (rule, base recipe, overrides that break only that rule, text the message must contain)
RULE_CASES = [
    ("check_finite_numbers", "tiny_dp1", ["optimizer.adam_eps=inf"],
     "optimizer.adam_eps=inf must be a finite number (not nan or inf); set it, e.g. "
     "optimizer.adam_eps=1e-08"),
    ("check_finite_numbers", "tiny_dp1", ["model.init_method_std=inf"],
     "model.init_method_std=inf must be a finite number"),
    ("check_finite_numbers", "tiny_dp1", ["cluster.gpu_memory_gib=nan"],
     "cluster.gpu_memory_gib=nan must be a finite number"),
    ("check_empty_strings", "tiny_dp1", ["checkpoint.load=''"],
     "checkpoint.load='' is empty; give it a value, or checkpoint.load=null to leave it unset"),
    ("check_empty_strings", "tiny_dp1", ["output_dir=' '"],
     "output_dir=' ' is empty; give it a value, e.g. output_dir=runs"),
    ("check_name_is_a_name", "tiny_dp1", ["name=../../esc"],
     "name=../../esc is not a plain name (runs go to runs/<name>-<time>); give one without "
     "'/' or '..', e.g. name=esc, or set run_dir= to choose the directory"),
    ("check_name_is_a_name", "tiny_dp1", ["name=team/exp1"],
     "name=team/exp1 is not a plain name"),
    ("check_non_negative_counts", "tiny_dp1", ["train.eval_iters=-1"],
     "train.eval_iters=-1 must not be negative; set train.eval_iters=0"),
    ("check_non_negative_counts", "tiny_dp1", ["optimizer.clip_grad=-1.0"],
     "optimizer.clip_grad=-1.0 must not be negative"),
    ("check_vocab_padding", "tiny_dp1", ["model.make_vocab_size_divisible_by=0"],
     "model.make_vocab_size_divisible_by=0 must be at least 1; set "
     "model.make_vocab_size_divisible_by=128"),
    ("check_vocab_padding", "tiny_dp1", ["model.vocab_size=200"],
     "model.vocab_size=200 is smaller than the byte tokenizer's 256 ids; set model.vocab_size=256"),
    ("check_world_size", "tiny_tp2_pp2", ["cluster.gpus_per_node=6"],
     "world size 6 (1 node x 6) is not divisible by TP2 x PP2 x CP1 = 4"),
    ("check_heads_divisible_by_tensor", "tiny_tp2",
     ["model.num_attention_heads=3", "model.kv_channels=16"],
     "model.num_attention_heads=3 is not divisible by parallel.tensor=2"),
    ("check_heads_divisible_by_tensor", "tiny_tp2",
     ["model.num_attention_heads=6", "model.kv_channels=16", "model.num_query_groups=3"],
     "model.num_query_groups=3 (KV heads) and parallel.tensor=2 must divide one another"),
    ("check_query_groups", "tiny_dp1", ["model.num_query_groups=3"],
     "model.num_attention_heads=4 is not divisible by model.num_query_groups=3"),
    ("check_head_width", "tiny_dp1", ["model.hidden_size=66"],
     "model.hidden_size=66 is not divisible by model.num_attention_heads=4; change one of them "
     "or set model.kv_channels"),
    ("check_rotary_percent_range", "tiny_dp1", ["model.rotary_percent=0.0"],
     "model.rotary_percent=0 must be in (0, 1], the share of each head's channels RoPE rotates; "
     "set it, e.g. model.rotary_percent=0.5"),
    ("check_rotary_percent_needs_rope", "tiny_dp1",
     ["model.position_embedding=learned_absolute", "model.rotary_percent=0.5"],
     "model.rotary_percent=0.5 only applies to RoPE, but "
     "model.position_embedding=learned_absolute; set model.position_embedding=rope or "
     "model.rotary_percent=1.0"),
    ("check_rotary_channels_even", "tiny_dp1", ["model.rotary_percent=0.1"],
     "model.rotary_percent=0.1 rotates 1 of a head's 16 channels; RoPE turns channel pairs, so "
     "the count must be even and at least 2: choose a share that gives one, e.g. "
     "model.rotary_percent=0.5"),
    ("check_rotary_channels_even", "tiny_dp1", ["model.kv_channels=15"],
     "model.rotary_percent=1 rotates 15 of a head's 15 channels; RoPE turns channel pairs, so a "
     "head needs an even width: set model.kv_channels to an even number, e.g. 16"),
    ("check_zero_centered_gamma_layers", "tiny_dp1",
     ["model.layernorm_zero_centered_gamma=true", "model.transformer_impl=local"],
     "model.layernorm_zero_centered_gamma=true needs Transformer Engine's norms, but "
     "model.transformer_impl=local builds torch's, which refuse it; set "
     "model.transformer_impl=auto or model.layernorm_zero_centered_gamma=false"),
    ("check_virtual_pipeline", "tiny_tp2", ["parallel.virtual_pipeline=2"],
     "parallel.virtual_pipeline=2 needs parallel.pipeline > 1 (got 1); set "
     "parallel.virtual_pipeline=null"),
    ("check_virtual_pipeline", "tiny_pp2", ["parallel.virtual_pipeline=1"],
     "parallel.virtual_pipeline=1 is not interleaving; set parallel.virtual_pipeline=null"),
    ("check_layers_per_stage", "tiny_pp2_vpp2", ["model.num_layers=6"],
     "model.num_layers=6 cannot be split evenly over PP2 x VPP2 = 4 model chunks"),
    ("check_layers_per_stage", "tiny_pp2", ["model.num_layers=5"],
     "model.num_layers=5 cannot be split evenly over PP2 model chunks"),
    ("check_sequence_divisible_by_context", "tiny_dp2",
     ["parallel.context=2", "model.seq_length=130"],
     "model.seq_length=130 must be divisible by 2 x parallel.context = 4"),
    ("check_sequence_parallel_needs_tensor", "tiny_dp2", ["parallel.sequence_parallel=true"],
     "parallel.sequence_parallel=true needs parallel.tensor > 1"),
    ("check_sequence_divisible_by_tensor", "tiny_tp2_sp", ["model.seq_length=129"],
     "per-CP-rank sequence (129 / CP1 = 129) must be divisible by parallel.tensor=2"),
    # A world too large for the batch names the field that made it, and the most nodes the
    # batch fills, not the DP size it gives (nor is it also the divisibility rule's mistake).
    ("check_batch_fills_data_parallel", "tiny_tp2_pp2", ["cluster.nodes=1000000"],
     "cluster.nodes=1,000,000 (x cluster.gpus_per_node=4) gives world size 4,000,000, so "
     "DP1,000,000 at TP2 x PP2 x CP1, but train.global_batch_size=8 holds 4 micro-batches of "
     "train.micro_batch_size=2: enough for DP4 at most; set cluster.nodes=4 at most (of 4 ranks "
     "each), or raise train.global_batch_size to a multiple of 2,000,000"),
    ("check_batch_fills_data_parallel", "tiny_dp1", ["cluster.gpus_per_node=8"],
     "cluster.gpus_per_node=8 (on cluster.nodes=1) gives world size 8, so DP8 at TP1 x PP1 x "
     "CP1, but train.global_batch_size=8 holds 4 micro-batches of train.micro_batch_size=2: "
     "enough for DP4 at most; set cluster.nodes=1 cluster.gpus_per_node=4 at most"),
    ("check_wsd_settings_need_wsd", "tiny_dp1", ["scheduler.wsd_decay_iters=50"],
     "scheduler.wsd_decay_iters=50 shapes the WSD schedule's anneal, but scheduler.style=cosine; "
     "set scheduler.style=wsd or drop it"),
    # A micro-batch larger than the whole batch: no world size helps, the batch sizes do.
    ("check_micro_batch_within_global", "tiny_dp1", ["train.micro_batch_size=16"],
     "train.micro_batch_size=16 is larger than train.global_batch_size=8, of which a "
     "micro-batch is a part; set train.micro_batch_size=8 or less, or raise "
     "train.global_batch_size"),
    ("check_global_batch", "tiny_dp2", ["train.global_batch_size=6"],
     "train.global_batch_size=6 is not divisible by train.micro_batch_size=2 x DP2 = 4; "
     "set the global batch to a multiple of that"),
    ("check_interleaved_microbatches", "tiny_pp2_vpp2", ["train.global_batch_size=6"],
     "needs the micro-batches per step (3) divisible by parallel.pipeline=2"),
    ("check_interleaved_p2p", "tiny_pp2_vpp2", ["parallel.batch_p2p_comm=true"],
     "silently wrong losses in Megatron Core; set parallel.batch_p2p_comm=false"),
    ("check_expert_parallel", "tiny_dp2", ["parallel.expert=2"],
     "parallel.expert=2 / expert_tensor need an MoE model; set model.num_moe_experts or "
     "parallel.expert=1"),
    ("check_expert_parallel", "tiny_dp2",
     ["model.num_moe_experts=3", "parallel.expert=2", *MOE_NO_BIAS],
     "model.num_moe_experts=3 is not divisible by parallel.expert=2"),
    ("check_expert_world_size", "tiny_dp2",
     ["model.num_moe_experts=4", "parallel.expert=4", *MOE_NO_BIAS],
     "world size 2 is not divisible by PP1 x expert-TP1 x EP4 = 4"),
    ("check_router_topk", "tiny_dp1",
     ["model.num_moe_experts=2", "model.moe_router_topk=3", "model.add_bias_linear=false"],
     "model.moe_router_topk=3 exceeds model.num_moe_experts=2"),
    ("check_moe_bias", "tiny_dp1", ["model.num_moe_experts=2"],
     "MoE models cannot use linear biases with the Megatron Core local layer spec "
     "(in-place-on-view error in the expert MLP); set model.add_bias_linear=false"),
    ("check_hybrid_symbols", HYBRID, ["model.hybrid_layer_pattern=M*-XE-"],
     "model.hybrid_layer_pattern=M*-XE- has the unknown symbol 'X'; use M (Mamba2)"),
    ("check_hybrid_symbols", HYBRID, ["model.hybrid_layer_pattern=M*-GE-"],
     "model.hybrid_layer_pattern uses 'G' (gated delta net), which no layer spec here builds"),
    ("check_mtp_depths", SUPER, ["model.hybrid_layer_pattern=MEM*EME/*E/"],
     "model.hybrid_layer_pattern=MEM*EME/*E/ has an empty MTP depth ('/' with no layers after "
     "it)"),
    ("check_mtp_depths", SUPER, ["model.hybrid_layer_pattern=MEM*EME/", *NO_MTP],
     "has an empty MTP depth"),
    ("check_mtp_depths", SUPER, ["model.hybrid_layer_pattern=MEM*EME/*|E/*|E"],
     "cuts an MTP depth with '|'; MTP layers all live on the last pipeline stage"),
    ("check_mtp_depths", SUPER, ["model.hybrid_layer_pattern=MEM*EME/*E/*-"],
     "has MTP depths of different layers (*E, *-)"),
    ("check_mtp_settings_need_depths", SUPER, ["model.hybrid_layer_pattern=MEM*EME",
                                               "model.mtp_loss_scaling_factor=0.1"],
     "model.mtp_use_repeated_layer=True needs MTP depths, but model.hybrid_layer_pattern has "
     "no '/'"),
    ("check_mtp_loss_scale", SUPER, ["model.mtp_loss_scaling_factor=0"],
     "model.mtp_loss_scaling_factor=0 must be positive"),
    ("check_mtp_packed_context_parallel", SUPER,
     ["train.micro_batch_size=1", "parallel.context=2", "cluster.gpus_per_node=2",
      "data.source=blend", "data.blend=x.yaml", "data.documents=packed"],
     "MTP depths with data.documents=packed (packed rows) and parallel.context=2"),
    ("check_mtp_full_recompute_blocks", SUPER,
     ["train.recompute=full", "train.recompute_num_layers=2"],
     "train.recompute_num_layers=2 with train.recompute=full and MTP depths (model."
     "hybrid_layer_pattern after '/'): Megatron recomputes MTP only one layer per block; set "
     "train.recompute_num_layers=1"),
    ("check_moe_latent_size", SUPER, ["model.moe_latent_size=64"],
     "model.moe_latent_size=64 is not below model.hidden_size=64"),
    ("check_moe_settings_need_experts", "tiny_dp1", ["model.moe_latent_size=16"],
     "model.moe_latent_size=16 needs an MoE model"),
    ("check_hybrid_length", HYBRID, ["model.hybrid_layer_pattern=M*-ME"],
     "model.hybrid_layer_pattern has 5 layers but model.num_layers=6; set model.num_layers=5"),
    ("check_hybrid_segments", "hybrid_tiny_pp2_pipes", ["model.hybrid_layer_pattern=M*|-M|E-"],
     "model.hybrid_layer_pattern has 3 '|' segments but PP2 needs 2; cut the pattern into 2"),
    ("check_hybrid_segments", "hybrid_tiny_pp2_vpp2", ["model.hybrid_layer_pattern=M*-|M|E-"],
     "has 3 '|' segments but PP2 x VPP2 needs 4"),
    ("check_hybrid_segments", "hybrid_tiny_pp2_pipes", ["model.hybrid_layer_pattern=M*-ME-|"],
     "model.hybrid_layer_pattern has an empty pipeline segment"),
    ("check_hybrid_virtual_needs_pipes", "hybrid_tiny_pp2",
     ["parallel.virtual_pipeline=2", "model.hybrid_layer_pattern=M*-ME-M*-ME-",
      "model.num_layers=12"],
     "parallel.virtual_pipeline=2 with a hybrid model needs '|' in model.hybrid_layer_pattern"),
    ("check_hybrid_uneven_with_pipes", "hybrid_tiny_pp2_pipes", ["parallel.first_stage_layers=4"],
     "parallel.first_stage_layers/last_stage_layers cannot be used with '|'"),
    ("check_hybrid_experts", HYBRID, ["model.hybrid_layer_pattern=M*-M--"],
     "model.num_moe_experts=4 but model.hybrid_layer_pattern has no E (MoE) layer"),
    ("check_hybrid_experts", HYBRID, [*DENSE_HYBRID, "model.hybrid_layer_pattern=M*-ME-"],
     "model.hybrid_layer_pattern has E (MoE) layers but model.num_moe_experts is not set"),
    ("check_hybrid_positions", HYBRID, ["model.position_embedding=learned_absolute"],
     "model.position_embedding=learned_absolute with a hybrid model; set "
     "model.position_embedding=none"),
    ("check_mamba_heads", HYBRID, ["model.mamba_num_heads=null", "model.mamba_head_dim=48"],
     "model.mamba_head_dim=48 does not divide d_inner = 2 x model.hidden_size = 128"),
    ("check_mamba_heads", HYBRID, ["model.mamba_num_groups=3"],
     "Mamba heads (8) are not divisible by model.mamba_num_groups=3"),
    ("check_mamba_tensor_parallel", "hybrid_tiny_tp2_sp", ["model.mamba_num_heads=9",
                                                           "model.mamba_num_groups=3"],
     "Mamba heads (9) are not divisible by parallel.tensor=2"),
    ("check_mamba_tensor_parallel", "hybrid_tiny_tp2_sp", ["model.mamba_num_groups=1"],
     "model.mamba_num_groups=1 is not divisible by parallel.tensor=2"),
    ("check_mamba_context_parallel", "hybrid_tiny_dp2_distopt",
     [*DENSE_HYBRID, "parallel.context=2", "model.mamba_num_heads=3", "model.mamba_num_groups=1",
      "optimizer.distributed=false"],
     "Mamba heads per TP rank (3) are not divisible by parallel.context=2"),
    ("check_mamba_context_parallel", "tiny_cp4",
     [*DENSE_HYBRID, "model.num_layers=6", "model.mamba_num_heads=12", "model.mamba_num_groups=6",
      "model.mamba_head_dim=16", "model.normalization=RMSNorm", "model.add_bias_linear=false"],
     "Mamba groups per TP rank (6) and parallel.context=4 must divide one another"),
    ("check_expert_bias", HYBRID, ["model.moe_router_score_function=softmax"],
     "model.moe_router_expert_bias=true needs model.moe_router_score_function=sigmoid"),
    ("check_single_expert_softmax", "mixtral_tiny_ep2_dp2", ["model.moe_router_topk=1"],
     "model.moe_router_topk=1 with model.moe_router_score_function=softmax gives the router"),
    ("check_router_scaling", HYBRID, ["model.moe_router_topk_scaling_factor=0"],
     "model.moe_router_topk_scaling_factor=0 must be positive"),
    ("check_moe_settings_need_experts", "tiny_dp1", ["model.moe_router_expert_bias=true",
                                                    "model.moe_router_score_function=sigmoid"],
     "model.moe_router_expert_bias=True needs an MoE model"),
    ("check_non_negative_counts", HYBRID, ["model.moe_router_bias_update_rate=-0.1"],
     "model.moe_router_bias_update_rate=-0.1 must not be negative"),
    ("check_moe_tensor_parallel", "tiny_tp2", ["model.num_moe_experts=2", *MOE_NO_BIAS],
     "MoE with parallel.tensor=2 needs sequence parallel"),
    ("check_profiler_window", "tiny_dp1",
     ["plugins.profiler.enabled=true", "train.train_iters=10", "scheduler.warmup_iters=1",
      "plugins.profiler.start_step=10"],
     "plugins.profiler.start_step=10 with steps=2 profiles up to step 11, past "
     "train.train_iters=10"),
    ("check_profiler_counts", "tiny_dp1", ["plugins.profiler.steps=0"],
     "plugins.profiler.steps=0 must be at least 1; set it, e.g. plugins.profiler.steps=2"),
    ("check_profiler_counts", "tiny_dp1", ["plugins.profiler.start_step=-1"],
     "plugins.profiler.start_step=-1 must be at least 1; set it, e.g. "
     "plugins.profiler.start_step=5"),
    ("check_profiler_counts", "tiny_dp1", ["plugins.profiler.enabled=true",
                                           "plugins.profiler.steps=0"],
     "plugins.profiler.steps=0 must be at least 1"),
    ("check_fp8_shapes", "tiny_dp1", ["plugins.fp8.format=hybrid", "model.ffn_hidden_size=200"],
     "plugins.fp8.format=hybrid needs model.ffn_hidden_size divisible by 16, got 200; adjust it or "
     "set plugins.fp8.format=null"),
    ("check_fp8_shapes", "tiny_dp1",
     ["plugins.fp8.format=e4m3", "model.hidden_size=72"],
     "needs model.hidden_size divisible by 16, got 72"),
    ("check_fp8_shapes", "tiny_tp2_sp", ["plugins.fp8.format=hybrid", "model.seq_length=100"],
     "needs tokens per rank per micro-batch (seq_length / CP [/ TP with SP] x micro_batch_size) "
     "divisible by 16, got 100"),
    ("check_fp8_delayed_recompute_modules", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "train.recompute=selective",
      "train.recompute_modules=[core_attn,layernorm]"],
     "train.recompute_modules has layernorm, which Megatron cannot recompute with "
     "plugins.fp8.recipe=delayed"),
    ("check_fp8_param_gather_distributed", "tiny_dp1",
     ["precision.dtype=bf16", "plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.param_gather=true"],
     "plugins.fp8.param_gather=true keeps the weights in FP8 and refreshes them from the "
     "distributed optimizer's fp32 shards, but optimizer.distributed=false"),
    ("check_fp8_param_gather_master", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "plugins.fp8.param_gather=true", "optimizer.distributed=true"],
     "plugins.fp8.param_gather=true with precision.dtype=fp32: FP8 weights are refreshed from "
     "the fp32 master copy"),
    ("check_fp8_param_gather_offload", "tiny_dp2_bf16_offload",
     ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.param_gather=true"],
     "plugins.fp8.param_gather=true with plugins.fp8.recipe=tensorwise and "
     "optimizer.cpu_offload=true: Megatron offloads FP8 parameters with delayed scaling only"),
    ("check_fp4_format_and_recipe", "tiny_dp1", ["precision.dtype=bf16",
                                                  "plugins.fp8.format=e2m1"],
     "plugins.fp8.format=e2m1 (NVFP4) is scaled by plugins.fp8.recipe=nvfp4"),
    ("check_fp8_settings_unused", "tiny_dp1", ["plugins.fp8.recipe=tensorwise"],
     "plugins.fp8.recipe=tensorwise has no effect while plugins.fp8.format=null"),
    ("check_fp8_delayed_settings", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=mxfp8", "plugins.fp8.margin=2"],
     "plugins.fp8.margin=2 is read only by delayed scaling, but plugins.fp8.recipe=mxfp8"),
    ("check_fp8_scaling_values", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "plugins.fp8.amax_history_len=0"],
     "plugins.fp8.amax_history_len=0 must be at least 1"),
    ("check_fp8_bf16_layers_recipe", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "plugins.fp8.first_layers_bf16=1"],
     "plugins.fp8.first_layers_bf16=1 cannot be used with plugins.fp8.recipe=delayed"),
    ("check_fp8_bf16_layers_range", "tiny_pp2",
     ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.last_layers_bf16=3"],
     "plugins.fp8.last_layers_bf16=3 exceeds the 2 layers of one pipeline stage"),
    ("check_fp8_bf16_layers_leave_fp8", "tiny_dp1",
     ["plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise",
      "plugins.fp8.first_layers_bf16=2", "plugins.fp8.last_layers_bf16=2"],
     "keep all 4 layers in bf16, so nothing trains in FP8"),
    ("check_loss_scale_positive", "tiny_dp1", ["precision.dtype=fp16", "precision.hysteresis=0"],
     "precision.hysteresis=0 must be positive; set it, e.g. precision.hysteresis=2"),
    ("check_min_loss_scale", "tiny_dp1",
     ["precision.dtype=fp16", "precision.initial_loss_scale=4", "precision.min_loss_scale=8"],
     "precision.min_loss_scale=8 is above precision.initial_loss_scale=4"),
    ("check_loss_scale_needs_fp16", "tiny_dp1", ["precision.loss_scale=128"],
     "precision.loss_scale=128 only applies to fp16 training, but precision.dtype=fp32"),
    ("check_param_gather", "tiny_dp2",
     ["optimizer.overlap_param_gather=true", "optimizer.overlap_grad_reduce=true"],
     "optimizer.overlap_param_gather=true needs the distributed optimizer; set "
     "optimizer.distributed=true"),
    ("check_param_gather", "tiny_dp2_distopt", ["optimizer.overlap_param_gather=true"],
     "needs optimizer.overlap_grad_reduce=true"),
    ("check_fsdp_needs_distributed_optimizer", "tiny_dp2", ["optimizer.fsdp=optim_grads"],
     "optimizer.fsdp=optim_grads (Megatron FSDP) runs on the distributed optimizer"),
    ("check_torch_fsdp2", "tiny_dp2_distopt", ["optimizer.torch_fsdp2=true"],
     "optimizer.torch_fsdp2=true is not trained here: Megatron Core's FSDP2 wrapper builds its "
     "device mesh on CUDA only"),
    ("check_fsdp_pipeline", "tiny_pp2_dp2_overlap", ["optimizer.fsdp=optim_grads"],
     "optimizer.fsdp=optim_grads with parallel.pipeline=2: Megatron FSDP's device mesh spans "
     "DP x CP x EP x TP only"),
    ("check_fsdp_checkpoint_format", "tiny_dp2_fsdp",
     ["checkpoint.optimizer_format=fully_reshardable"],
     "checkpoint.optimizer_format=fully_reshardable is the distributed optimizer's format; "
     "optimizer.fsdp=optim_grads_params saves Megatron FSDP's fsdp_dtensor"),
    ("check_fsdp_async_save", "tiny_dp2_fsdp", ["checkpoint.async_save=true"],
     "checkpoint.async_save=true with optimizer.fsdp=optim_grads_params: Megatron FSDP's "
     "fsdp_dtensor checkpoints are written synchronously here"),
    ("check_fsdp_megatron_lm_format", "tiny_dp2_fsdp", ["checkpoint.format=megatron_lm"],
     "checkpoint.format=megatron_lm with optimizer.fsdp=optim_grads_params: Megatron-LM's "
     "layout is written for torch_dist checkpoints"),
    ("check_offload_needs_distributed_optimizer", "tiny_dp2",
     ["precision.dtype=bf16", "optimizer.cpu_offload=true"],
     "optimizer.cpu_offload=true runs Megatron's hybrid-device optimizer inside the distributed "
     "optimizer"),
    ("check_offload_fraction", "tiny_dp2_bf16_offload", ["optimizer.offload_fraction=1.5"],
     "optimizer.offload_fraction=1.5 is the share of the optimizer state moved to CPU memory; "
     "set it in [0, 1]"),
    ("check_offload_fraction", "tiny_dp2_distopt", ["optimizer.offload_fraction=0.5"],
     "optimizer.offload_fraction=0.5 has no effect without optimizer.cpu_offload=true"),
    ("check_offload_precision", "tiny_dp2_bf16_offload", ["precision.dtype=fp32"],
     "optimizer.cpu_offload=true with precision.dtype=fp32: Megatron's hybrid-device optimizer "
     "cannot take the distributed optimizer's fp32 shards"),
    ("check_offload_with_fsdp", "tiny_dp2_bf16_offload", ["optimizer.fsdp=optim_grads"],
     "optimizer.cpu_offload=true with optimizer.fsdp=optim_grads: Megatron's hybrid-device "
     "optimizer copies gradients into plain tensors"),
    ("check_evaluation", "tiny_dp1", ["train.eval_interval=50", "train.eval_iters=0"],
     "train.eval_interval=50 with train.eval_iters=0 evaluates nothing"),
    ("check_scheduler", "tiny_dp1", ["train.train_iters=100", "scheduler.warmup_iters=100"],
     "scheduler.warmup_iters=100 must be shorter than the decay span (train.train_iters=100); "
     "lower scheduler.warmup_iters"),
    ("check_scheduler", "tiny_dp1", ["scheduler.decay_iters=5"],
     "scheduler.warmup_iters=10 must be shorter than the decay span (scheduler.decay_iters=5)"),
    ("check_scheduler", "tiny_dp1",
     ["train.train_iters=100", "scheduler.style=wsd", "scheduler.wsd_decay_iters=150"],
     "scheduler.wsd_decay_iters=150 is longer than the decay span (100 steps)"),
    ("check_learning_rate", "tiny_dp1", ["optimizer.lr=0.0"],
     "optimizer.lr=0.0 must be positive"),
    ("check_learning_rate", "tiny_dp1", ["optimizer.min_lr=0.1"],
     "optimizer.min_lr=0.1 must be between 0 and optimizer.lr=0.003"),
    ("check_fractions", "tiny_dp1", ["model.hidden_dropout=1.0"],
     "model.hidden_dropout=1.0 must be in [0, 1)"),
    ("check_fractions", "tiny_dp1", ["data.heldout_fraction=0.0"],
     "data.heldout_fraction=0.0 must be in (0, 1)"),
    ("check_adam_betas", "tiny_dp1", ["optimizer.adam_beta1=1.5"],
     "optimizer.adam_beta1=1.5 must be in [0, 1) (the decay of Adam's moment estimates); set "
     "it, e.g. optimizer.adam_beta1=0.9"),
    ("check_adam_betas", "tiny_dp1", ["optimizer.adam_beta2=1.0"],
     "optimizer.adam_beta2=1 must be in [0, 1)"),
    ("check_adam_betas", "tiny_dp1", ["optimizer.adam_beta2=-0.1"],
     "optimizer.adam_beta2=-0.1 must be in [0, 1)"),
    ("check_adam_eps", "tiny_dp1", ["optimizer.adam_eps=-1"],
     "optimizer.adam_eps=-1 must be positive (Adam divides by sqrt(v) + eps); set it, e.g. "
     "optimizer.adam_eps=1e-08"),
    ("check_adam_eps", "tiny_dp1", ["optimizer.adam_eps=0"],
     "optimizer.adam_eps=0 must be positive"),
    ("check_init_method_std", "tiny_dp1", ["model.init_method_std=-0.02"],
     "model.init_method_std=-0.02 must be positive (the std of the normal weight init); set "
     "it, e.g. model.init_method_std=0.02"),
    ("check_init_method_std", "tiny_dp1", ["model.init_method_std=0"],
     "model.init_method_std=0 must be positive"),
    ("check_seed", "tiny_dp1", ["train.seed=-5"],
     "train.seed=-5 must be between 0 and 4,294,967,295; numpy takes 32-bit seeds; set it, "
     "e.g. train.seed=1234"),
    ("check_seed", "tiny_dp1", ["train.seed=99999999999"],
     "train.seed=99999999999 must be between 0 and 4,294,967,295"),
    ("check_seed", "tiny_tp2_pp2", ["train.seed=4294967295"],
     "train.seed=4294967295 must be between 0 and 4,294,967,195 (each of the 2 pipeline "
     "stages seeds train.seed + 100 x its stage)"),
    ("check_rope_scaling_factor", "tiny_dp1", ["model.rope_scaling_factor=0"],
     "model.rope_scaling_factor=0 must be positive; set it, e.g. model.rope_scaling_factor=8.0 "
     "(Llama 3.1), or model.rope_scaling_factor=null for no scaling"),
    ("check_cuda_graph_warmup_steps", "tiny_dp1",
     ["train.cuda_graphs=transformer_engine", "train.cuda_graph_warmup_steps=-1"],
     "train.cuda_graph_warmup_steps=-1 must not be negative (eager steps before the CUDA "
     "graphs are captured); set it, e.g. train.cuda_graph_warmup_steps=3"),
    ("check_cuda_graph_warmup_with_offloading", "tiny_dp1",
     ["model.transformer_impl=transformer_engine", "train.cuda_graphs=transformer_engine",
      "train.offload_modules=[core_attn]", "train.cuda_graph_warmup_steps=0"],
     "train.cuda_graph_warmup_steps=0 with train.offload_modules: Megatron needs at least one "
     "eager step"),
    ("check_checkpoint_load", "tiny_dp1", ["checkpoint.load_model_only=true"],
     "checkpoint.load_model_only=true needs a checkpoint to load"),
    ("check_keep_last", "tiny_dp1", ["checkpoint.keep_last=0"],
     "checkpoint.keep_last=0 must be at least 1; set checkpoint.keep_last=1 or more, or "
     "checkpoint.keep_last=null to keep every checkpoint"),
    ("check_async_save_needs_saves", "tiny_dp1",
     ["checkpoint.async_save=true", "checkpoint.save=false"],
     "checkpoint.async_save=true writes checkpoints in the background, but checkpoint.save=false "
     "writes none; set checkpoint.save=true (with checkpoint.save_interval=N) or "
     "checkpoint.async_save=false"),
    ("check_megatron_lm_format_needs_saves", "tiny_dp1",
     ["checkpoint.format=megatron_lm", "checkpoint.save=false"],
     "checkpoint.format=megatron_lm writes checkpoints Megatron-LM resumes, but "
     "checkpoint.save=false writes none; set checkpoint.save=true (with "
     "checkpoint.save_interval=N) or leave checkpoint.format at mcore_recipes"),
    ("check_resume_needs_run_dir", "tiny_dp1", ["checkpoint.resume=true"],
     "checkpoint.resume=true needs an explicit run_dir (it continues the run saved there); set "
     "run_dir=<run directory>, e.g. run_dir=runs/my-run, or checkpoint.resume=false"),
    ("check_resume_or_load", "tiny_dp1",
     ["checkpoint.resume=true", "run_dir=runs/a", "checkpoint.load=runs/b/checkpoints"],
     "checkpoint.resume=true and checkpoint.load=runs/b/checkpoints both say where to start; "
     "keep one: checkpoint.load=null to continue this run_dir's own checkpoints, or "
     "checkpoint.resume=false to start from checkpoint.load"),
    ("check_positive_sizes", "tiny_dp1", ["cluster.threads_per_rank=0"],
     "cluster.threads_per_rank=0 must be at least 1"),
    ("check_data_source", "tiny_dp1", ["data.source=blend"],
     "data.source=blend needs data.blend=<file>"),
    ("check_data_source", "tiny_dp1", ["data.blend=conf/data/python_stdlib.yaml"],
     "is set but data.source=python_stdlib; set data.source=blend"),
    ("check_data_source", "tiny_dp1", ["data.documents=packed"],
     "data.documents=packed needs prepared data (data.source=blend)"),
    ("check_documents_keep_eod_mask", "tiny_dp1",
     ["data.source=blend", "data.blend=x.yaml", "data.documents=packed",
      "train.micro_batch_size=1", "data.eod_mask_loss=false"],
     "data.documents=packed needs data.eod_mask_loss=true"),
    ("check_packing_micro_batch", "tiny_dp1",
     ["data.source=blend", "data.blend=x.yaml", "data.documents=inter_document"],
     "data.documents=inter_document makes packed rows, which need train.micro_batch_size=1"),
    ("check_packing_context_parallel", "tiny_dp1",
     ["train.micro_batch_size=1", "parallel.context=2",
      "cluster.gpus_per_node=2", "data.source=blend", "data.blend=x.yaml",
      "data.documents=inter_document"],
     "data.documents=inter_document does not support parallel.context=2"),
    ("check_cp_hierarchical_sizes", "tiny_cp4", ["plugins.context_parallel.comm_type=a2a+p2p"],
     "needs plugins.context_parallel.hierarchical_sizes [a2a size, p2p size], each at least 1, "
     "whose product is parallel.context=4"),
    ("check_cp_hierarchical_sizes", "tiny_cp4", ["plugins.context_parallel.comm_type=a2a+p2p",
                                                 "plugins.context_parallel.hierarchical_sizes=[-2,-2]"],
     "each at least 1, whose product is parallel.context=4, got [-2, -2]"),
    ("check_cp_hierarchical_sizes", "tiny_cp4", ["plugins.context_parallel.comm_type=a2a+p2p",
                                                 "plugins.context_parallel.hierarchical_sizes=[4]"],
     "each at least 1, whose product is parallel.context=4, got [4]"),
    ("check_fp8_needs_te_layers", "tiny_dp1", ["precision.dtype=bf16", "plugins.fp8.format=hybrid",
                                               "model.transformer_impl=local"],
     "plugins.fp8.format=hybrid runs in Transformer Engine's layers, but "
     "model.transformer_impl=local builds Megatron's own, which never use FP8; set "
     "model.transformer_impl=auto or plugins.fp8.format=null"),
    ("check_cp_a2a_heads", "tiny_cp4",
     ["plugins.context_parallel.comm_type=a2a", "model.num_attention_heads=2"],
     "comm_type=a2a splits heads over 4 CP ranks, but model.num_attention_heads=2"),
    ("check_distributed_timeout", "tiny_dp1", ["train.distributed_timeout_minutes=0"],
     "train.distributed_timeout_minutes=0 must be at least 1 (minutes a rank waits in a "
     "collective); set it, e.g. train.distributed_timeout_minutes=10"),
]


@pytest.mark.parametrize(
    ("rule", "recipe", "overrides", "message"),
    RULE_CASES,
    ids=[f"{case[0]}:{' '.join(case[2])}" for case in RULE_CASES],
)
def test_rule_triggers_alone_with_its_message(rule, recipe, overrides, message) -> None:
    cfg = apply_overrides(get_recipe(recipe), overrides)
    assert failing_rules(cfg) == [rule]
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("parallel.tensor=0", "parallel.tensor=0 must be at least 1; set parallel.tensor to a"),
        ("train.micro_batch_size=0", "train.micro_batch_size=0 must be at least 1"),
        ("model.num_query_groups=0", "model.num_query_groups=0 must be at least 1"),
        ("parallel.virtual_pipeline=0", "parallel.virtual_pipeline=0 must be at least 1"),
        ("cluster.gpu_memory_gib=0", "cluster.gpu_memory_gib=0.0 must be positive"),
    ],
)
def test_non_positive_sizes_are_reported_before_any_division(override, message) -> None:
    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), [override])
    with pytest.raises(ConfigError, match="must be") as caught:
        validate(cfg)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optimizer.lr=nan", "optimizer.lr=nan"),
        ("model.hidden_dropout=nan", "model.hidden_dropout=nan"),
        ("optimizer.min_lr=-inf", "optimizer.min_lr=-inf"),
        ("optimizer.lr=1e999", "optimizer.lr=inf"),
    ],
)
def test_non_finite_numbers_are_reported_before_the_rules_they_confuse(override, key) -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), [override])
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert str(caught.value).startswith(key) and "must be a finite number" in str(caught.value)


def test_no_rotary_line_follows_a_head_count_that_leaves_no_head_width() -> None:
    """64 channels over 3 heads has no whole head width: the head-count rule says so, and the
    RoPE rule, which would measure a 21-channel head, stays silent."""
    from recipes.models.gpt.rules import check_rotary_channels_even

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["model.num_attention_heads=3"])
    assert check_rotary_channels_even(cfg) is None


def test_every_rule_has_a_case() -> None:
    covered = {case[0] for case in RULE_CASES} | {"check_positive_sizes"}
    # The phase, ramp-up and fast-path rules' cases live beside their tests.
    covered |= {case[0] for case in (*PHASE_RULE_CASES, *RAMPUP_RULE_CASES,
                                     *FAST_PATH_RULE_CASES)}
    assert covered == {rule.__name__ for rule in all_rules(get_recipe("tiny_dp1"))}
    assert set(RULES) < set(all_rules(get_recipe("tiny_dp1")))  # plugin rules come on top


@pytest.mark.parametrize(
    ("vocab", "divisible_by", "tensor", "padded"),
    [(256, 128, 1, 256), (256, 128, 4, 512), (128256, 128, 8, 129024), (50257, 128, 1, 50304),
     (32000, 128, 1, 32000), (1000, 1, 3, 1002)],
)
def test_layout_pads_vocab_like_megatron(vocab, divisible_by, tensor, padded) -> None:
    cfg = get_recipe("tiny_dp1")
    cfg.model.vocab_size = vocab
    cfg.model.make_vocab_size_divisible_by = divisible_by
    cfg.parallel.tensor = tensor
    assert cfg.layout.padded_vocab == padded


@pytest.mark.parametrize("overlap", [True, False])
def test_interleaving_with_unbatched_p2p_is_accepted_overlapped_or_not(overlap) -> None:
    cfg = apply_overrides(
        get_recipe("tiny_pp2_vpp2"),
        [f"parallel.overlap_p2p_comm={str(overlap).lower()}", "parallel.batch_p2p_comm=false"],
    )
    assert (cfg.parallel.overlap_p2p_comm, cfg.parallel.batch_p2p_comm) == (overlap, False)
    validate(cfg)

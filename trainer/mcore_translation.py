"""The one place where our typed config becomes Megatron Core objects.

Parallel sizes (from the run's `Layout`, through `parallel_sizes`), precision and model shape
are translated here and nowhere else: process groups (`initialize_parallel_state`),
`TransformerConfig`, `DistributedDataParallelConfig` and the optimizer's `OptimizerConfig`.
Plugins adjust the transformer config through their hook afterwards (FP8, for one), and add
their fields to the data-parallel and optimizer configs here (FP8 parameters). Positions (RoPE's
base and rotated share) reach `GPTModel`/`HybridModel` through `position_fields`. Precision
reaches Megatron here as `precision.dtype` (params/pipeline dtype, bf16/fp16 flags of the
transformer and optimizer configs) and fp16's loss-scale settings (optimizer config). The run
also becomes Megatron-LM's argument namespace here (`megatron_lm_args`: what a checkpoint
Megatron-LM resumes carries as `args`), through Megatron-LM's own parser.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.activations import squared_relu
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.transformer import TransformerConfig

from recipes.config.layout import Layout
from recipes.config.schema import RunConfig
from recipes.models.hybrid.pattern import mtp_depths

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(cfg: RunConfig) -> torch.dtype:
    return _DTYPES[cfg.precision.dtype]


def parallel_sizes(layout: Layout) -> dict[str, int | None]:
    """The layout in Megatron's keywords, which `initialize_model_parallel` and
    `TransformerConfig` share: the only place our parallel sizes become Megatron's."""
    return {
        "tensor_model_parallel_size": layout.tensor,
        "pipeline_model_parallel_size": layout.pipeline,
        "virtual_pipeline_model_parallel_size": layout.virtual_pipeline,
        "context_parallel_size": layout.context,
        "expert_model_parallel_size": layout.expert,
        "expert_tensor_parallel_size": layout.expert_tensor,
    }


def initialize_parallel_state(layout: Layout, *, create_gloo_groups: bool = True,
                              timeout_minutes: int = 30, options: dict | None = None) -> None:
    """Create Megatron's TP/PP/CP/EP/DP process groups for this layout (default PG must exist);
    rank order is Megatron's default, the one `Layout.groups` reproduces. `timeout_minutes`
    bounds a collective in these groups (`train.distributed_timeout_minutes`; Megatron's own
    default is 30); `options` are the plugins' additions (`process_group_options`, e.g. the
    hierarchical CP groups of a2a+p2p)."""
    # destroy_model_parallel does not reset the hierarchical CP groups (parallel_state.py:129,
    # set at :1140 only when sizes are given): a second set-up in one process without them
    # would still see the first one's, destroyed, groups.
    parallel_state._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None
    parallel_state.initialize_model_parallel(
        **parallel_sizes(layout), create_gloo_process_groups=create_gloo_groups,
        distributed_timeout_minutes=timeout_minutes, **(options or {}),
    )


def _activation_fields(activation: str) -> dict:
    if activation == "swiglu":
        return {"activation_func": F.silu, "gated_linear_unit": True}
    if activation == "squared_relu":
        return {"activation_func": squared_relu, "gated_linear_unit": False}
    return {"activation_func": F.gelu, "gated_linear_unit": False}


def _recompute_fields(cfg: RunConfig, transformer_engine: bool = True) -> dict:
    mode = cfg.train.recompute
    if mode == "full":
        return {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": cfg.train.recompute_num_layers,
        }
    if mode == "selective":
        return {"recompute_granularity": "selective",
                "recompute_modules": cpu_recompute_modules(cfg, transformer_engine)}
    return {}


def _moe_fields(cfg: RunConfig) -> dict:
    m = cfg.model
    if m.num_moe_experts is None:
        return {}
    return {
        "num_moe_experts": m.num_moe_experts,
        "moe_router_topk": m.moe_router_topk,
        "moe_ffn_hidden_size": m.moe_ffn_hidden_size or m.ffn_hidden_size,
        "moe_aux_loss_coeff": m.moe_aux_loss_coeff,
        "moe_router_load_balancing_type": (
            m.moe_load_balancing if m.moe_aux_loss_coeff > 0 else "none"),
        "moe_router_score_function": m.moe_router_score_function,
        # Aux-loss-free balancing: Megatron keeps the bias as a buffer of the router and moves
        # it by the update rate after each step, from the tokens each expert received
        # (`transformer/moe/router.py`, `moe_utils.get_updated_expert_bias`).
        "moe_router_enable_expert_bias": m.moe_router_expert_bias,
        "moe_router_bias_update_rate": m.moe_router_bias_update_rate,
        "moe_router_topk_scaling_factor": m.moe_router_topk_scaling_factor,
        "moe_router_dtype": "fp32" if m.moe_router_fp32 else None,
        "moe_shared_expert_intermediate_size": m.moe_shared_expert_ffn_hidden_size,
        # Latent MoE: the routed experts' width, and the layer's two projections to and from
        # it (`transformer/moe/moe_layer.py:264-289, 478-483, 584-586`).
        "moe_latent_size": m.moe_latent_size,
    }


def _hybrid_fields(cfg: RunConfig) -> dict:
    """A hybrid model's Mamba mixer, as `TransformerConfig` reads it (`ssm/mamba_mixer.py:
    233-249`); the conv width and scan chunk are the mixer's own arguments (the layer spec,
    `trainer/models/hybrid/spec.py`)."""
    m = cfg.model
    if not m.is_hybrid:
        return {}
    return {
        "is_hybrid_model": True,
        "mamba_state_dim": m.mamba_state_dim,
        "mamba_head_dim": m.mamba_head_dim,
        "mamba_num_groups": m.mamba_num_groups,
        "mamba_num_heads": m.mamba_num_heads,
        **_mtp_fields(cfg),
    }


def _mtp_fields(cfg: RunConfig) -> dict:
    """Multi-token prediction: `HybridModel` reads the depths' layers from the pattern after
    '/', but builds the block and computes its loss only with `mtp_num_layers` set
    (`models/hybrid/hybrid_model.py:217-229, 554`, `transformer/multi_token_prediction.py:
    760-895`); the loss is the depths' mean times the scaling factor."""
    depths = mtp_depths(cfg.model.hybrid_layer_pattern)
    if not depths:
        return {}
    return {"mtp_num_layers": depths,
            "mtp_loss_scaling_factor": cfg.model.mtp_loss_scaling_factor,
            "mtp_use_repeated_layer": cfg.model.mtp_use_repeated_layer}


def _pipeline_comm_fields(cfg: RunConfig) -> dict:
    p = cfg.parallel
    interleaved = p.virtual_pipeline is not None
    # Megatron-LM only overlaps p2p for the interleaved schedule; validation has already
    # refused batch_p2p_comm with interleaving (silently wrong losses in 0.19.2).
    return {
        "overlap_p2p_comm": p.overlap_p2p_comm if interleaved else False,
        "batch_p2p_comm": p.batch_p2p_comm if interleaved else True,
    }


def gradient_accumulation_fusion_available() -> bool:
    """Megatron's own linears (the output layer, beside TE's) fuse the weight-gradient
    accumulation only with APEX's `fused_weight_gradient_mlp_cuda` and raise without it
    (`tensor_parallel/layers.py:49-53`, `:1070-1079`); the `gpu` extra installs TE, not APEX.
    Transformer Engine's own linears fuse it without APEX (`fuse_wgrad_accumulation`,
    `extensions/transformer_engine.py:1037, 1267, 2230`): the model build keeps Megatron's own
    linears unfused then (`trainer/gpu_fast_paths.py`, the `wgrad_fusion_without_apex` patch)."""
    from megatron.core.tensor_parallel import layers

    return layers._grad_accum_fusion_available


def fusion_fields(cfg: RunConfig, transformer_engine: bool) -> dict:
    """The GPU fast paths Megatron-LM and Megatron Bridge turn on with Transformer Engine's
    layers; each one off only for its stated reason. With the local layers (CPU ranks, or
    `model.transformer_impl=local`) all stay at Megatron's defaults, off: they need CUDA
    kernels."""
    if not transformer_engine:
        return {}
    m = cfg.model
    return {
        # Bias + activation in one kernel: Megatron has kernels for GeLU and SwiGLU only (not
        # squared ReLU), and GeLU's needs the bias (transformer_config.py:2114-2127).
        "bias_activation_fusion": m.activation == "swiglu" or (
            m.activation == "gelu" and m.add_bias_linear),
        "bias_dropout_fusion": True,  # bias + dropout + residual add in one kernel
        # TE's fused RoPE, on packed THD rows too (the unfused THD path loops over documents in
        # Python with .tolist() in every layer, rope_utils.py).
        "apply_rope_fusion": m.position_embedding == "rope",
        "masked_softmax_fusion": True,
        "persist_layer_norm": True,
        "cross_entropy_loss_fusion": True,
        # Megatron's native kernel; TE's has known stability issues and Megatron-LM refuses it
        # (model_parallel_config.py:536-543).
        "cross_entropy_fusion_impl": "native",
        # TE's linears accumulate their weight gradients into the fp32 main grads in the GEMM;
        # Megatron's own output layer does so only with APEX (see above). Megatron FSDP fuses
        # it only with TE >= 2.10 (mcore_fsdp_adapter.py:147-151 asserts).
        "gradient_accumulation_fusion": m.gradient_accumulation_fusion and (
            cfg.optimizer.fsdp == "none" or _te_at_least("2.10")),
    }


def _te_at_least(version: str) -> bool:
    from megatron.core.utils import is_te_min_version

    return is_te_min_version(version)


def _dispatcher(cfg: RunConfig, transformer_engine: bool) -> str:
    """The flex dispatcher's kernels are CUDA's: the local layers exchange the same tokens with
    the all-to-all dispatcher (the same routing, the same result)."""
    wanted = cfg.model.moe_token_dispatcher
    return "alltoall" if wanted == "flex" and not transformer_engine else wanted


def fast_path_fields(cfg: RunConfig, transformer_engine: bool) -> dict:
    """The GPU fast paths (`recipes/config/fast_paths.py`) as `TransformerConfig` fields. Each
    needs Transformer Engine's layers and CUDA: with the local layers (CPU ranks) they stay at
    Megatron's defaults, off, and the plan line names them (`fast_paths.off_on_cpu`)."""
    m, p, t = cfg.model, cfg.parallel, cfg.train
    te = transformer_engine
    fields: dict = {}
    if m.num_moe_experts:
        fields.update({
            "moe_token_dispatcher_type": _dispatcher(cfg, te),
            "moe_flex_dispatcher_backend": m.moe_flex_backend,
            "moe_grouped_gemm": m.moe_grouped_gemm and te,
            "moe_permute_fusion": m.moe_permute_fusion and te,
            "moe_router_fusion": m.moe_router_fusion and te,
            "moe_shared_expert_overlap": m.moe_shared_expert_overlap and te,
            "use_fused_weighted_squared_relu": m.moe_fused_squared_relu and te,
        })
    if not te:
        return fields
    if t.cuda_graphs != "none":
        fields.update({
            "cuda_graph_impl": t.cuda_graphs,
            "cuda_graph_modules": list(t.cuda_graph_modules),
            "cuda_graph_warmup_steps": t.cuda_graph_warmup_steps,
            # Graphed layers draw their dropout masks from TE's tracker, which Megatron-LM turns
            # on for every CUDA graph (training/arguments.py:1873-1879).
            "use_te_rng_tracker": True,
        })
    if t.offload_modules:
        fields.update({"fine_grained_activation_offloading": True,
                       "offload_modules": list(t.offload_modules)})
    fields.update({"tp_comm_overlap": p.tp_comm_overlap,
                   "overlap_moe_expert_parallel_comm": p.ep_comm_overlap})
    return fields


def cpu_recompute_modules(cfg: RunConfig, transformer_engine: bool) -> list[str]:
    """moe_act is recomputed only in grouped-GEMM experts (`transformer_config.py:1784`), which
    the local layers do not build: they recompute the rest."""
    modules = list(cfg.train.recompute_modules)
    if transformer_engine:
        return modules
    return [module for module in modules if module != "moe_act"] or ["core_attn"]


FUSIONS = ("bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion",
           "masked_softmax_fusion", "persist_layer_norm", "cross_entropy_loss_fusion",
           "gradient_accumulation_fusion")


def fusions_line(config: TransformerConfig) -> str:
    """Which GPU fusions a built config has on and off (printed once by a run on TE layers)."""
    on = [name for name in FUSIONS if getattr(config, name)]
    off = [name for name in FUSIONS if not getattr(config, name)]
    return (f"layers: Transformer Engine's; fusions on: {', '.join(on) or 'none'}; off: "
            f"{', '.join(off) or 'none'}")


def build_transformer_config(
    cfg: RunConfig, *, cpu_initialization: bool, meta_device: bool = False,
    transformer_engine: bool = False,
) -> TransformerConfig:
    """Megatron `TransformerConfig` for this run's model, layout, precision and recompute, with
    the GPU fusions when the layers are Transformer Engine's (`fusion_fields`).

    A model built on the meta device (the dry run, the HF interop's templates) runs nothing:
    it is built for its weights, which context parallelism does not split, so with CP 1 (the
    local attention refuses CP; only TE's runs it), on the local layers without LayerNorm1p
    (the same weights), and with no initial values drawn."""
    m, dtype = cfg.model, torch_dtype(cfg)
    sizes = parallel_sizes(cfg.layout)
    if meta_device:
        sizes["context_parallel_size"] = 1
    # A zero-centred gamma is how a norm's one weight is read, not its shape: a weights-only
    # build on the local layers (whose torch norm refuses it, `transformer/torch_norm.py:44-46`)
    # holds the same parameters without it. Training runs are refused before launch instead.
    zero_centered = m.layernorm_zero_centered_gamma and (transformer_engine or not meta_device)
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        normalization=m.normalization,
        layernorm_zero_centered_gamma=zero_centered,
        add_bias_linear=m.add_bias_linear,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        # The local attention's softmax precision in bf16/fp16 (`fusions/fused_softmax.py`);
        # nothing here sets apply_query_key_layer_scaling, the one setting that forces it on.
        attention_softmax_in_fp32=m.attention_softmax_in_fp32,
        init_method_std=m.init_method_std,
        **sizes,
        num_layers_in_first_pipeline_stage=cfg.parallel.first_stage_layers,
        num_layers_in_last_pipeline_stage=cfg.parallel.last_stage_layers,
        sequence_parallel=cfg.parallel.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=cfg.precision.dtype == "bf16",
        fp16=cfg.precision.dtype == "fp16",
        # Per-token loss over the whole global batch: Megatron sums token losses and divides by
        # the loss-token count all-reduced over DP x CP in finalize_model_grads.
        calculate_per_token_loss=True,
        # Layout-invariant initialisation: each full weight is drawn on CPU, then split by TP.
        use_cpu_initialization=cpu_initialization,
        init_model_with_meta_device=meta_device,
        # Meta tensors hold no values: drawing them runs the init functions' reference
        # decompositions for nothing (80% of a 120B hybrid's weights-only build).
        perform_initialization=not meta_device,
        deallocate_pipeline_outputs=True,
        **_activation_fields(m.activation),
        **_recompute_fields(cfg, transformer_engine),
        **_moe_fields(cfg),
        **_hybrid_fields(cfg),
        **_pipeline_comm_fields(cfg),
        **fusion_fields(cfg, transformer_engine),
        **fast_path_fields(cfg, transformer_engine),
    )


def position_fields(cfg: RunConfig) -> dict:
    """Positions, as `GPTModel` and `HybridModel` take them (not `TransformerConfig` fields):
    the kind, RoPE's base and the share of each head's channels it rotates
    (`models/common/embeddings/rotary_pos_embedding.py:71-80`)."""
    m = cfg.model
    return {"position_embedding_type": m.position_embedding, "rotary_base": m.rotary_base,
            "rotary_percent": m.rotary_percent}


def _fsdp_precision_fields(cfg: RunConfig) -> dict:
    """Megatron FSDP's own buffer precisions, set to what the rest of the project means by
    `precision.*`: an FP32 main copy of the weights only when they are not FP32 already (its
    default keeps one always, distributed_data_parallel_config.py:185; None uses the weights
    themselves), and FP32 gradient buffers when `precision.grad_reduce_in_fp32` (it ignores
    that flag and accumulates in the weights' dtype, param_and_grad_buffer.py:2306-2315)."""
    if cfg.optimizer.fsdp == "none":
        return {}
    fp32_weights = cfg.precision.dtype == "fp32"
    fp32_grads = cfg.precision.grad_reduce_in_fp32 and not fp32_weights
    return {"megatron_fsdp_main_params_dtype": None if fp32_weights else torch.float32,
            "megatron_fsdp_main_grads_dtype": torch.float32 if fp32_grads else None}


def build_ddp_config(cfg: RunConfig) -> DistributedDataParallelConfig:
    """Data parallelism's config; plugins add their fields (`ddp_fields`: FP8 parameter
    all-gather)."""
    o = cfg.optimizer
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=cfg.precision.grad_reduce_in_fp32,
        overlap_grad_reduce=o.overlap_grad_reduce,
        overlap_param_gather=o.overlap_param_gather,
        use_distributed_optimizer=o.distributed,
        # Megatron FSDP (`trainer/model.py` wraps each chunk in its adapter). With the per-token
        # loss it reduces gradients with a plain SUM (fsdp/src/megatron_fsdp/megatron_fsdp.py:
        # 370-373), never with the PREMUL_SUM gloo lacks (param_and_grad_buffer.py:4748).
        use_megatron_fsdp=o.fsdp != "none",
        data_parallel_sharding_strategy="no_shard" if o.fsdp == "none" else o.fsdp,
        bucket_size=o.bucket_size,
        **_fsdp_precision_fields(cfg),
        # Per-token loss needs summed (not averaged) DP gradients; Megatron divides by tokens.
        average_in_collective=False,
        **cfg.plugins.ddp_fields(cfg),
    )


def _loss_scale_fields(cfg: RunConfig) -> dict:
    """fp16 loss scaling, as Megatron's optimizer reads it (`optimizer/__init__.py:649-662`):
    a static scale when `loss_scale` is set, else a DynamicGradScaler for fp16 (x2 growth after
    `loss_scale_window` clean steps, x0.5 after `hysteresis` overflows). A step whose gradients
    overflow returns `update_successful=False` (`optimizer/optimizer.py:820-822`): the trainer
    then skips the scheduler and counts the step as skipped."""
    p = cfg.precision
    return {
        "loss_scale": p.loss_scale,
        "initial_loss_scale": p.initial_loss_scale,
        "min_loss_scale": p.min_loss_scale,
        "loss_scale_window": p.loss_scale_window,
        "hysteresis": p.hysteresis,
    }


def _offload_fields(cfg: RunConfig) -> dict:
    """Optimizer CPU offload as Megatron-LM sets it (`--optimizer-cpu-offload` with
    `--use-precision-aware-optimizer`, megatron/training/arguments.py:1803-1807): the
    hybrid-device optimizer steps `offload_fraction` of the state on the CPU. Pinned host
    buffers need a CUDA driver; without one (CPU ranks) they are plain memory."""
    o = cfg.optimizer
    if not o.cpu_offload:
        return {}
    pinned = torch.cuda.is_available()
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": o.offload_fraction,
            "use_precision_aware_optimizer": True, "pin_cpu_grads": pinned,
            "pin_cpu_params": pinned}


def build_optimizer_config(cfg: RunConfig) -> MegatronOptimizerConfig:
    o, dtype = cfg.optimizer, cfg.precision.dtype
    return MegatronOptimizerConfig(
        **_loss_scale_fields(cfg),
        optimizer="adam",
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        params_dtype=torch_dtype(cfg),
        use_distributed_optimizer=o.distributed,
        **_offload_fields(cfg),
        **cfg.plugins.optimizer_fields(cfg),
    )


# --- Megatron-LM's argument namespace ------------------------------------------------------

@functools.cache
def megatron_lm_parser() -> argparse.ArgumentParser:
    """Megatron-LM's own argument parser (`megatron/training/arguments.py:45`,
    `add_megatron_arguments`, in the wheel), built once: its 800 arguments take a while."""
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False, add_help=False))


def megatron_lm_args(cfg: RunConfig, step: int, consumed_samples: int) -> argparse.Namespace:
    """The `args` Megatron-LM saves in a checkpoint, for this run after `step` steps: its parser
    over the run's Megatron-LM command line (`print=megatron_args`), with what its
    `validate_args` and training loop fill in and its `load_checkpoint` reads back
    (`training/checkpointing.py:2149-2160, 2467-2478`, `check_checkpoint_args` :143-186): the
    world and DP size, the padded vocabulary, the counters, the torch_dist format."""
    from recipes.config.megatron_args import to_megatron_args

    args, _ = megatron_lm_parser().parse_known_args(to_megatron_args(cfg))
    m, layout = cfg.model, cfg.layout
    filled = {
        "world_size": layout.world_size, "data_parallel_size": layout.data_parallel, "rank": 0,
        "padded_vocab_size": layout.padded_vocab, "ckpt_format": "torch_dist",
        "use_dist_ckpt": True, "iteration": step, "consumed_train_samples": consumed_samples,
        "skipped_train_samples": 0, "consumed_valid_samples": 0,
        "num_query_groups": m.num_query_groups or m.num_attention_heads,
        "kv_channels": m.kv_channels or m.hidden_size // m.num_attention_heads,
        "virtual_pipeline_model_parallel_size": cfg.parallel.virtual_pipeline,
        "transformer_pipeline_model_parallel_size": cfg.parallel.pipeline,
        "params_dtype": torch_dtype(cfg),
        "lr_decay_iters": cfg.scheduler.decay_iters or cfg.train.train_iters,
    }
    for name, value in filled.items():
        setattr(args, name, value)
    return args

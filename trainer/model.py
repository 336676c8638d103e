"""Build this rank's model chunks (GPTModel, or HybridModel for a hybrid layer pattern) and wrap
them in Megatron DDP.

Each family says its layer spec and model class (`trainer/models/<family>/build.py`); here
they are put together the same way for every family: Transformer Engine's layers on GPU ranks
(`model.transformer_impl`, never a silent fallback) and Megatron Core's local ones on CPU
ranks, the spec adapted by the CPU runtime there and then by the plugins, one chunk per
virtual pipeline stage, the precision wrapper and DDP.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.hybrid.hybrid_model import HybridModel
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.pipeline_parallel.utils import is_vp_first_stage, is_vp_last_stage
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import Float16Module
from megatron.core.utils import unwrap_model

from plugins.protocol.errors import UserError
from plugins.protocol.hooks import PluginSet
from recipes.config.schema import RunConfig, uses_transformer_engine
from trainer.cpu_runtime.runtime import adapt_cpu_layer_spec, cpu_runtime_active
from trainer.models.gpt import build as gpt
from trainer.models.hybrid import build as hybrid


def transformer_engine_in_use(cfg: RunConfig) -> bool:
    """Whether this rank builds Transformer Engine's layers (`model.transformer_impl`: TE on
    GPU ranks unless `local`). A GPU rank asked for TE without it is refused in one line here
    too; the launcher refuses it before any rank starts (`recipes/config/machine.py`)."""
    use = uses_transformer_engine(cfg.model.transformer_impl, on_gpu=torch.cuda.is_available())
    if use and importlib.util.find_spec("transformer_engine") is None:
        raise UserError(f"model.transformer_impl={cfg.model.transformer_impl} builds Transformer "
                        "Engine's layers on GPUs, but it is not installed here; install the gpu "
                        "extra (pip install -e '.[gpu]') or set model.transformer_impl=local")
    return use


def adapted_spec(spec: Any, config: TransformerConfig, plugins: PluginSet) -> Any:
    """A layer spec as this rank builds it: the CPU runtime's adaptations on CPU ranks (the
    sequence-parallel norm, packed and CP attention), then the plugins' (`layer_spec` hook)."""
    if cpu_runtime_active():
        spec = adapt_cpu_layer_spec(spec, config)
    return plugins.layer_spec(spec, config)


def _vp_stages(cfg: RunConfig) -> list[int | None]:
    vpp = cfg.parallel.virtual_pipeline
    return [None] if vpp is None else list(range(vpp))


def build_model_chunks(
    cfg: RunConfig, config: TransformerConfig, plugins: PluginSet
) -> list[GPTModel | HybridModel]:
    """This rank's model chunks (one per virtual pipeline stage), unwrapped."""
    vpp = cfg.parallel.virtual_pipeline
    first_pp = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    last_pp = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    family = hybrid if cfg.model.is_hybrid else gpt
    transformer_engine = transformer_engine_in_use(cfg)
    chunks = []
    for vp_stage in _vp_stages(cfg):
        stage = 0 if vp_stage is None else vp_stage
        spec = family.layer_spec(cfg, config, vp_stage, transformer_engine)
        chunk = family.model_chunk(cfg, config, adapted_spec(spec, config, plugins), vp_stage,
                                   pre_process=first_pp and is_vp_first_stage(stage, vpp),
                                   post_process=last_pp and is_vp_last_stage(stage, vpp))
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunks.append(chunk)
    return chunks


def wrap_for_precision(chunks: list[GPTModel], config: TransformerConfig) -> list:
    """bf16/fp16: cast every parameter (norms included) as Megatron-LM's Float16Module does.

    Without it the local spec's torch norms stay fp32 beside bf16 weights, and the distributed
    optimizer's parameter-group index map (built before it reorders groups by dtype) then points
    at the wrong main parameters when the optimizer state is saved.
    """
    if not (config.bf16 or config.fp16):
        return chunks
    return [Float16Module(config, chunk) for chunk in chunks]


def wrap_with_ddp(
    chunks: list[GPTModel], config: TransformerConfig, ddp_config: DistributedDataParallelConfig
) -> list[DistributedDataParallel]:
    """Megatron DDP per chunk; the distributed optimizer's buffer layout is computed up front.
    Under Megatron FSDP (`ddp_config.use_megatron_fsdp`) each chunk is wrapped in Megatron's
    FSDP adapter instead (`wrap_with_fsdp`)."""
    if ddp_config.use_megatron_fsdp:
        return wrap_with_fsdp(chunks, config, ddp_config)
    dp_size = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    expert_dp_size = parallel_state.get_expert_data_parallel_world_size()
    # Resolve the bucket size as Megatron DDP does, so the precomputed layout matches its buckets.
    if ddp_config.bucket_size is None:
        ddp_config.bucket_size = max(40_000_000, 1_000_000 * dp_size)
    if not ddp_config.overlap_grad_reduce:
        ddp_config.bucket_size = None
    wrapped = []
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    for index, chunk in enumerate(chunks):
        # As Megatron DDP does: only the first chunk of the first stage is bucketed.
        bucket_size = ddp_config.bucket_size if index == 0 and pp_rank == 0 else None
        layout = None
        if ddp_config.use_distributed_optimizer:
            params = [p for p in chunk.parameters() if p.requires_grad]
            layout = DistributedOptimizer.compute_full_param_layout(
                params,
                bucket_size,
                dp_size,
                ddp_config,
                expert_data_parallel_world_size=expert_dp_size,
            )
        wrapped.append(
            DistributedDataParallel(
                config=config,
                ddp_config=ddp_config,
                module=chunk,
                disable_bucketing=index > 0,
                full_param_layout=layout,
            )
        )
    return wrapped


def wrap_with_fsdp(chunks: list, config: TransformerConfig,
                   ddp_config: DistributedDataParallelConfig) -> list:
    """Megatron FSDP per chunk, as Megatron-LM's `get_model` wraps it (training.py:1837-1900):
    the bucket size resolved as for DDP, only the first chunk of the first stage bucketed. On
    CPU ranks the adapter is told its device (it asks CUDA for one otherwise,
    `distributed/fsdp/mcore_fsdp_adapter.py:152`)."""
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    dp_size = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    if ddp_config.bucket_size is None:
        ddp_config.bucket_size = max(40_000_000, 1_000_000 * dp_size)
    if not ddp_config.overlap_grad_reduce:
        ddp_config.bucket_size = None
    device = torch.device("cpu") if cpu_runtime_active() else None
    return [FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                     disable_bucketing=index > 0, device=device)
            for index, chunk in enumerate(chunks)]


def bare_chunks(model: list) -> list:
    """The model chunks inside every wrapper: DDP, the precision wrapper and, under Megatron
    FSDP, both its adapter and the `MegatronFSDP` module inside it, which Megatron's own
    `unwrap_model` stops at (utils.py:2817-2827)."""
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import (
        FullyShardedDataParallel,
        MegatronFSDP,
    )

    return unwrap_model(model, (DistributedDataParallel, FullyShardedDataParallel, MegatronFSDP,
                                Float16Module))


def distinct_parameter_counts(chunks: list[torch.nn.Module], tp_rank: int) -> tuple[int, int]:
    """(dense, expert) parameters this rank adds to the whole model, each weight counted once.

    Skipped as copies: weights replicated over TP (norms, row-parallel biases) on TP ranks > 0,
    the tied output layer on the last pipeline stage (a copy of the input embedding), and the
    input embedding a hybrid model's MTP block holds on a last stage that is not the first
    (kept equal to the first stage's, `language_module.py:247-300`).
    """
    dense = expert = 0
    for chunk in bare_chunks(chunks):
        tied_copy = chunk.share_embeddings_and_output_weights and not chunk.pre_process
        mtp_copy = getattr(chunk, "mtp_process", False) and not chunk.pre_process
        for name, param in chunk.named_parameters():
            if tied_copy and name.startswith("output_layer."):
                continue
            if mtp_copy and name.startswith("embedding."):
                continue
            # Routed experts by name too: without EP (and expert-TP = TP) Megatron reduces
            # their gradients with the dense ones (`allreduce` true), but they are experts.
            if not getattr(param, "allreduce", True) or ".experts." in name:
                expert += param.numel()
            elif tp_rank == 0 or getattr(param, "tensor_model_parallel", False):
                dense += param.numel()
    return dense, expert

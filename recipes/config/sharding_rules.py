"""Megatron FSDP (`optimizer.fsdp`) and optimizer CPU offload (`optimizer.cpu_offload`): the
combinations Megatron Core 0.19.2 refuses or fails on, refused before any rank starts.

Each rule names what of Megatron it stands for (an assert, or the place a run would fail) and
the way out. Measured on CPU ranks where Megatron's code does not depend on the device (the
mesh arithmetic, the optimizer's parameter lists); the trainer runs everything these rules let
through (tests/dist/test_fsdp.py).
"""

from __future__ import annotations

from recipes.config.schema import RunConfig

OFFLOAD_FRACTION_DEFAULT = 1.0


def check_fsdp_pipeline(cfg: RunConfig) -> str | None:
    """Megatron FSDP lays the whole world out as DP x CP x EP x TP for its device mesh
    (`distributed/fsdp/mcore_fsdp_adapter.py` `_get_dp_tp_mesh`: einops `(dp_cp ep tp) -> ep
    dp_cp tp` over `arange(world_size)`), so with pipeline stages the wrap fails."""
    o, p = cfg.optimizer, cfg.parallel
    if o.fsdp != "none" and p.pipeline > 1:
        return (f"optimizer.fsdp={o.fsdp} with parallel.pipeline={p.pipeline}: Megatron FSDP's "
                "device mesh spans DP x CP x EP x TP only (mcore_fsdp_adapter.py "
                "_get_dp_tp_mesh) and cannot wrap a pipeline stage; set parallel.pipeline=1, or "
                "optimizer.fsdp=none (the distributed optimizer shards optimizer state with PP)")
    return None


def check_fsdp_checkpoint_format(cfg: RunConfig) -> str | None:
    """Megatron FSDP saves only `fsdp_dtensor` (`optimizer/distrib_optimizer.py:1514-1517`
    refuses any other sharding type), which reshards over DP by itself: the distributed
    optimizer's `checkpoint.optimizer_format` does not apply."""
    o, c = cfg.optimizer, cfg.checkpoint
    if o.fsdp != "none" and c.optimizer_format != "dp_reshardable":
        return (f"checkpoint.optimizer_format={c.optimizer_format} is the distributed "
                f"optimizer's format; optimizer.fsdp={o.fsdp} saves Megatron FSDP's fsdp_dtensor "
                "(distrib_optimizer.py:1514 refuses others); drop "
                "checkpoint.optimizer_format or set optimizer.fsdp=none")
    return None


def check_fsdp_async_save(cfg: RunConfig) -> str | None:
    """`fsdp_dtensor` checkpoints are written by torch DCP here, synchronously; the asynchronous
    writer is Megatron's torch_dist one (`trainer/checkpoint/async_save.py`)."""
    o, c = cfg.optimizer, cfg.checkpoint
    if o.fsdp != "none" and c.async_save:
        return (f"checkpoint.async_save=true with optimizer.fsdp={o.fsdp}: Megatron FSDP's "
                "fsdp_dtensor checkpoints are written synchronously here (the asynchronous "
                "writer is torch_dist's); set checkpoint.async_save=false")
    return None


def check_fsdp_megatron_lm_format(cfg: RunConfig) -> str | None:
    """`checkpoint.format=megatron_lm` adds Megatron-LM's layout to the torch_dist save
    (`trainer/checkpoint/state_dicts.py`); Megatron FSDP's fsdp_dtensor save has no such
    writer, so a run would not get the checkpoint it asked for."""
    o, c = cfg.optimizer, cfg.checkpoint
    if o.fsdp != "none" and c.format == "megatron_lm":
        return (f"checkpoint.format=megatron_lm with optimizer.fsdp={o.fsdp}: Megatron-LM's "
                "layout is written for torch_dist checkpoints, not Megatron FSDP's fsdp_dtensor; "
                "set checkpoint.format=mcore_recipes, or optimizer.fsdp=none")
    return None


def check_offload_needs_distributed_optimizer(cfg: RunConfig) -> str | None:
    """The hybrid-device optimizer runs through the precision-aware distributed optimizer
    (Megatron-LM asserts `--use-precision-aware-optimizer`, `megatron/training/arguments.py:
    1803-1807`; that one asserts the distributed optimizer, `optimizer/optimizer_config.py:
    434-436`)."""
    o = cfg.optimizer
    if o.cpu_offload and not o.distributed:
        return ("optimizer.cpu_offload=true runs Megatron's hybrid-device optimizer inside the "
                "distributed optimizer (optimizer_config.py:434 asserts it); set "
                "optimizer.distributed=true")
    return None


def check_offload_fraction(cfg: RunConfig) -> str | None:
    """The share of the optimizer state stepped on the CPU lies in [0, 1] and only means
    something with offload on."""
    o = cfg.optimizer
    if not 0.0 <= o.offload_fraction <= 1.0:
        return (f"optimizer.offload_fraction={o.offload_fraction} is the share of the optimizer "
                "state moved to CPU memory; set it in [0, 1], e.g. optimizer.offload_fraction=1.0")
    if not o.cpu_offload and o.offload_fraction != OFFLOAD_FRACTION_DEFAULT:
        return (f"optimizer.offload_fraction={o.offload_fraction} has no effect without "
                "optimizer.cpu_offload=true; set optimizer.cpu_offload=true or drop the fraction")
    return None


def check_offload_precision(cfg: RunConfig) -> str | None:
    """With fp32 weights the distributed optimizer hands out views of the model's parameters
    as its shards (`optimizer/distrib_optimizer.py:466`), which the hybrid-device optimizer's
    torch constructor refuses: `can't optimize a non-leaf Tensor`."""
    o, dtype = cfg.optimizer, cfg.precision.dtype
    if o.cpu_offload and dtype == "fp32":
        return ("optimizer.cpu_offload=true with precision.dtype=fp32: Megatron's hybrid-device "
                "optimizer cannot take the distributed optimizer's fp32 shards (views of the "
                "weights, distrib_optimizer.py:466: can't optimize a non-leaf Tensor); set "
                "precision.dtype=bf16 (the FP32 master copy is then what moves to the CPU)")
    return None


def check_offload_with_fsdp(cfg: RunConfig) -> str | None:
    """The hybrid-device optimizer copies each gradient into a plain tensor of the parameter's
    global shape (`optimizer/cpu_offloading/hybrid_optimizer.py:107-114`); Megatron FSDP's
    gradients are DTensors, so the first step fails (`aten.copy_.default got mixed torch.Tensor
    and DTensor`)."""
    o = cfg.optimizer
    if o.cpu_offload and o.fsdp != "none":
        return (f"optimizer.cpu_offload=true with optimizer.fsdp={o.fsdp}: Megatron's "
                "hybrid-device optimizer copies gradients into plain tensors and fails on Megatron "
                "FSDP's DTensor gradients (hybrid_optimizer.py:114); offload with the distributed "
                "optimizer (optimizer.fsdp=none), or shard without offload")
    return None


def check_torch_fsdp2(cfg: RunConfig) -> str | None:
    """torch FSDP2 through Megatron Core 0.19.2 (`TorchFullyShardedDataParallel`) builds its
    device mesh on CUDA alone (`distributed/torch_fully_sharded_data_parallel.py:81`), excludes
    the distributed optimizer, pipeline and expert parallelism and tied embeddings
    (Megatron-LM's `arguments.py:997-1013`), and saves torch_dcp or DTensor state, which this
    trainer neither writes nor reads; Megatron FSDP's `optim_grads_params` is the same ZeRO-3
    sharding, trained, checkpointed and resumed here."""
    if cfg.optimizer.torch_fsdp2:
        return ("optimizer.torch_fsdp2=true is not trained here: Megatron Core's FSDP2 wrapper "
                "builds its device mesh on CUDA only (torch_fully_sharded_data_parallel.py:81), "
                "excludes the distributed optimizer, PP, EP and tied embeddings, and saves "
                "checkpoints this trainer does not write; use optimizer.fsdp=optim_grads_params "
                "(Megatron FSDP, the same ZeRO-3 sharding) with optimizer.distributed=true")
    return None


SHARDING_RULES = (
    check_torch_fsdp2,
    check_fsdp_pipeline,
    check_fsdp_checkpoint_format,
    check_fsdp_async_save,
    check_fsdp_megatron_lm_format,
    check_offload_needs_distributed_optimizer,
    check_offload_fraction,
    check_offload_precision,
    check_offload_with_fsdp,
)

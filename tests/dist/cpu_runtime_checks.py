"""Per-rank checks of the CPU runtime plugin, run through `launch_ranks` by
tests/dist/test_cpu_runtime_dist.py. Each check exercises Megatron Core's own code and returns
plain data; the tests decide what is right.

Entry: `tests.dist.cpu_runtime_checks:run_checks` with payload
`{"tp": int, "checks": [names from CHECKS], "skip": [patch names to leave out]}`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trainer.cpu_runtime.runtime import activate_cpu_runtime, adapt_local_layer_spec


def _tp_group_and_rank() -> tuple[dist.ProcessGroup, int]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_tensor_model_parallel_rank(),
    )


def check_rng_streams() -> dict[str, Any]:
    """Draws from the default stream and from the tracker's model-parallel stream."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)
    default_draws = torch.rand(4).tolist()
    with get_cuda_rng_tracker().fork():
        model_parallel_draws = torch.rand(4).tolist()
    return {
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "dp_rank": parallel_state.get_data_parallel_rank(),
        "default": default_draws,
        "model_parallel": model_parallel_draws,
    }


def check_uneven_all_gather() -> dict[str, Any]:
    """TP rank t contributes t + 1 rows to Megatron's sequence-parallel gather."""
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    group, tp_rank = _tp_group_and_rank()
    split_sizes = [rank + 1 for rank in range(group.size())]
    local = torch.arange(3.0) + 10.0 * dist.get_rank() + torch.zeros(tp_rank + 1, 1)
    gathered = gather_from_sequence_parallel_region(
        local, group=group, output_split_sizes=split_sizes
    )
    return {
        "tp_group_ranks": dist.get_process_group_ranks(group),
        "local": local.tolist(),
        "gathered": gathered.tolist(),
    }


def check_all_to_all_split_tensors() -> dict[str, Any]:
    """Megatron's all_to_all with split sizes held in tensors, as MoE passes them off CUDA."""
    from megatron.core.tensor_parallel.mappings import all_to_all

    group, tp_rank = _tp_group_and_rank()
    peers = range(group.size())
    # TP rank t sends t + 1 + p rows to TP rank p (uneven in both directions).
    input_splits = torch.tensor([tp_rank + 1 + peer for peer in peers])
    output_splits = torch.tensor([peer + 1 + tp_rank for peer in peers])
    rows = int(input_splits.sum())
    local = torch.arange(2.0 * rows).reshape(rows, 2) + 1000.0 * dist.get_rank()
    received = all_to_all(
        group, local, output_split_sizes_=output_splits, input_split_sizes=input_splits
    )
    return {
        "tp_group_ranks": dist.get_process_group_ranks(group),
        "local": local.tolist(),
        "input_splits": input_splits.tolist(),
        "received": received.tolist(),
    }


def _gather_weight(weight: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    shards = [torch.empty_like(weight) for _ in range(group.size())]
    dist.all_gather(shards, weight.detach().contiguous(), group=group)
    return torch.cat(shards, dim=dim)


def check_sp_linear_backward() -> dict[str, float]:
    """TP+SP ColumnParallelLinear -> RowParallelLinear forward and backward, compared with the
    same computation on the full (gathered) weights."""
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    group, tp_rank = _tp_group_and_rank()
    config = ModelParallelConfig(
        tensor_model_parallel_size=group.size(), sequence_parallel=True, use_cpu_initialization=True
    )
    init = functools.partial(torch.nn.init.normal_, std=0.2)
    torch.manual_seed(7)  # the same master weights and input on every rank
    column = ColumnParallelLinear(8, 16, config=config, init_method=init, bias=False)
    row = RowParallelLinear(
        16,
        8,
        config=config,
        init_method=init,
        bias=False,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    full_input = torch.randn(4 * group.size(), 2, 8)  # [sequence, batch, hidden]

    local_input = full_input.chunk(group.size())[tp_rank].clone().requires_grad_()
    local_output, _ = row(column(local_input)[0])
    (local_output**2).sum().backward()

    reference_input = full_input.clone().requires_grad_()
    w1, w2 = _gather_weight(column.weight, 0, group), _gather_weight(row.weight, 1, group)
    reference_output = reference_input @ w1.T @ w2.T
    (reference_output**2).sum().backward()
    return {
        "output_error": float(
            (local_output - reference_output.chunk(group.size())[tp_rank]).abs().max()
        ),
        "input_grad_error": float(
            (local_input.grad - reference_input.grad.chunk(group.size())[tp_rank]).abs().max()
        ),
    }


def _tiny_gpt_config(tp: int) -> Any:
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        ffn_hidden_size=32,
        tensor_model_parallel_size=tp,
        sequence_parallel=True,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _norm_grads_after_finalize(keep_sequence_parallel_tags: bool) -> dict[str, list[float]]:
    """Norm grads of a tiny TP+SP GPT after one backward and Megatron's finalize_model_grads."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    group, _ = _tp_group_and_rank()
    config = _tiny_gpt_config(group.size())
    model_parallel_cuda_manual_seed(99)
    torch.manual_seed(99)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    model = GPTModel(
        config, adapt_local_layer_spec(spec, config), vocab_size=64, max_sequence_length=8
    )
    if not keep_sequence_parallel_tags:
        for param in model.parameters():
            param.sequence_parallel = False
    ddp_model = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    tokens = torch.arange(16).reshape(2, 8) * 5 % 64  # the same batch on every rank
    positions = torch.arange(8).expand(2, 8)
    ddp_model(tokens, positions, None, labels=tokens).sum().backward()
    finalize_model_grads([ddp_model])
    return {
        name: param.main_grad.flatten().tolist()
        for name, param in model.named_parameters()
        if "layernorm" in name
    }


def _error_building_with_unadapted_spec() -> str:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    group, _ = _tp_group_and_rank()
    config = _tiny_gpt_config(group.size())
    try:
        GPTModel(
            config,
            get_gpt_decoder_block_spec(config, use_transformer_engine=False),
            vocab_size=64,
            max_sequence_length=8,
        )
    except AssertionError as error:  # Megatron's own check (torch_norm.py:50)
        return str(error)
    return ""


def check_sp_norm_grads() -> dict[str, Any]:
    _, tp_rank = _tp_group_and_rank()
    return {
        "tp_rank": tp_rank,
        "tagged": _norm_grads_after_finalize(keep_sequence_parallel_tags=True),
        "untagged": _norm_grads_after_finalize(keep_sequence_parallel_tags=False),
        "unadapted_spec_error": _error_building_with_unadapted_spec(),
    }


CHECKS: dict[str, Callable[[], Any]] = {
    "rng_streams": check_rng_streams,
    "uneven_all_gather": check_uneven_all_gather,
    "all_to_all_split_tensors": check_all_to_all_split_tensors,
    "sp_linear_backward": check_sp_linear_backward,
    "sp_norm_grads": check_sp_norm_grads,
}


def run_checks(payload: dict[str, Any]) -> dict[str, Any]:
    """Activates the CPU runtime without payload['skip'], sets up TP (DP = the rest), runs
    payload['checks'] in order and returns their results by name."""
    activate_cpu_runtime(skip=frozenset(payload.get("skip", ())))
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=payload["tp"])
    try:
        return {name: CHECKS[name]() for name in payload["checks"]}
    finally:
        parallel_state.destroy_model_parallel()

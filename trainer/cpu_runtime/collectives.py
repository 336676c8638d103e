"""Two torch.distributed calls whose gloo form rejects what Megatron Core passes them.

Both are replaced on the `torch.distributed` module, which is where Megatron looks them up at
call time (`tensor_parallel/mappings.py` calls `torch.distributed.all_gather(...)` and
`torch.distributed.all_to_all_single(...)`).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist


def gather_unevenly_over_gloo(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: dist.ProcessGroup | None
) -> None:
    """all_gather where ranks contribute different sizes: pad every contribution to the largest,
    gather into one flat buffer, then copy each rank's true part into its output slot."""
    longest = max(out.numel() for out in tensor_list)
    padded = tensor.new_zeros(longest)
    padded[: tensor.numel()] = tensor.reshape(-1)
    gathered = tensor.new_empty(len(tensor_list) * longest)
    dist.all_gather_into_tensor(gathered, padded, group=group)
    for rank, out in enumerate(tensor_list):
        start = rank * longest
        out.copy_(gathered[start : start + out.numel()].view(out.shape))


def install_uneven_all_gather() -> None:
    """Gloo's all_gather needs equal sizes (`invalid tensor size at index 1`), but Megatron's
    `_gather_along_first_dim` gathers uneven splits (`tensor_parallel/mappings.py:154`, MoE
    alltoall dispatcher with TP/SP)."""
    original_all_gather = dist.all_gather

    @functools.wraps(original_all_gather)
    def all_gather(tensor_list, tensor, group=None, async_op=False):
        uneven = len({out.shape for out in tensor_list}) > 1
        if uneven and not async_op and dist.get_backend(group) == dist.Backend.GLOO:
            gather_unevenly_over_gloo(tensor_list, tensor, group)
            return None
        return original_all_gather(tensor_list, tensor, group=group, async_op=async_op)

    dist.all_gather = all_gather


def split_sizes_as_list(split_sizes: object) -> object:
    """A tensor of split sizes becomes the list of ints the C++ binding accepts."""
    if isinstance(split_sizes, torch.Tensor):
        return split_sizes.tolist()
    return split_sizes


def install_list_split_sizes() -> None:
    """`all_to_all_single` accepts split sizes only as lists (`incompatible function
    arguments`), but MoE keeps them as tensors off CUDA: `moe_utils.py:1184` converts them
    only when `is_cuda`, and `tensor_parallel/mappings.py:460` passes them on unchanged."""
    original_all_to_all_single = dist.all_to_all_single

    @functools.wraps(original_all_to_all_single)
    def all_to_all_single(
        output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
    ):
        return original_all_to_all_single(
            output,
            input,
            split_sizes_as_list(output_split_sizes),
            split_sizes_as_list(input_split_sizes),
            group=group,
            async_op=async_op,
        )

    dist.all_to_all_single = all_to_all_single

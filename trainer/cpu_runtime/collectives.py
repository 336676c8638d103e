"""torch.distributed over gloo where it falls short of what Megatron Core asks of NCCL.

Two calls whose gloo form rejects what Megatron passes are replaced on the `torch.distributed`
module, which is where Megatron looks them up at call time (`tensor_parallel/mappings.py` calls
`torch.distributed.all_gather(...)` and `torch.distributed.all_to_all_single(...)`). And gloo
process groups are made with one worker thread (`install_one_gloo_worker`): with torch's two,
collectives left running at once (Megatron FSDP's overlapped gathers) can damage the heap.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

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


class OneWorkerGloo:
    """Stands where `torch.distributed.distributed_c10d` looks up `ProcessGroupGloo`: every gloo
    backend it makes runs its collectives on one worker thread instead of torch's default two.

    Each of the two workers, after a collective, records its name in the group's status
    (`ProcessGroupGloo::runLoop`, torch 2.13: `pgStatus_->lastCompletedWorkName`) after letting
    go of the group's lock. Two collectives ending together on both workers assign that
    `std::string` at once, and a name longer than the 15 characters kept inline (e.g.
    `ALLGATHER_COALESCED`, Megatron FSDP's coalesced bucket gathers left running with
    `overlap_param_gather`) is freed twice: glibc then aborts (`malloc(): unaligned tcache chunk
    detected`) or a later allocation segfaults. AddressSanitizer names it: `attempting
    double-free` of a 20-byte region, both frees in `runLoop`. One worker runs the group's
    collectives in the order they were started, as NCCL runs one stream; the CPU ranks' speed is
    not what they are for. Type checks against it are those of `ProcessGroupGloo`.
    """

    def __init__(self, gloo: Any) -> None:
        self.gloo = gloo

    def __call__(self, store: Any, rank: int, size: int, options: Any = None, *,
                 timeout: datetime.timedelta = datetime.timedelta(minutes=30)) -> Any:
        if options is None:
            options = self.gloo._Options()
            options._timeout = timeout
            options._devices = [self.gloo.create_default_device()]
        options._threads = 1
        return self.gloo(store, rank, size, options)

    def __instancecheck__(self, instance: object) -> bool:
        return isinstance(instance, self.gloo)

    def __getattr__(self, name: str) -> Any:  # create_default_device, _Options, ...
        return getattr(self.gloo, name)


def install_one_gloo_worker() -> None:
    """Gloo groups made from now on have one worker thread (`OneWorkerGloo`); a group made
    before keeps its two."""
    from torch.distributed import distributed_c10d

    if not isinstance(distributed_c10d.ProcessGroupGloo, OneWorkerGloo):
        distributed_c10d.ProcessGroupGloo = OneWorkerGloo(distributed_c10d.ProcessGroupGloo)

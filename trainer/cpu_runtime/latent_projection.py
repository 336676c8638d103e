"""A latent MoE's two projections on CPU ranks, where Megatron Core asks Transformer Engine for
them (the `moe_latent_projections` runtime patch).

`MoELayer` builds `fc1_latent_proj` (hidden -> latent) and `fc2_latent_proj` (latent -> hidden)
as `TELinear(..., parallel_mode="duplicated")` and asserts Transformer Engine first
(`transformer/moe/moe_layer.py:264-289`); without TE, `TELinear` is None (`:61-64`), so no
latent MoE builds on CPU. A duplicated linear is a plain linear whose whole weight every TP rank
holds: TE draws it in the data-parallel RNG stream, the same on every TP rank, tags its
parameters as not tensor-parallel, and, under sequence parallelism, as sequence-parallel, so
`finalize_model_grads` sums their gradients over TP (`extensions/transformer_engine.py:
975-1062`). `DuplicatedLinear` is that, in torch; the module global is rebound on CPU ranks
only, so GPU ranks keep TE's.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F


class DuplicatedLinear(torch.nn.Module):
    """`TELinear(parallel_mode="duplicated")` in torch: the same constructor and the same
    `(output, bias)` return as Megatron's linears."""

    def __init__(self, input_size: int, output_size: int, *, parallel_mode: str | None,
                 config: Any, init_method: Any, bias: bool, skip_bias_add: bool,
                 skip_weight_param_allocation: bool = False, tp_comm_buffer_name: str | None = None,
                 is_expert: bool = False, symmetric_ar_type: str | None = None,
                 tp_group: Any = None, name: str | None = None) -> None:
        super().__init__()
        if parallel_mode != "duplicated" or skip_weight_param_allocation or is_expert:
            raise ValueError("DuplicatedLinear stands in for TELinear's duplicated mode only "
                             f"(got parallel_mode={parallel_mode!r}, is_expert={is_expert})")
        self.skip_bias_add = skip_bias_add
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size,
                                                     dtype=config.params_dtype))
        with _data_parallel_stream():
            init_method(self.weight)
        self.bias = None
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype))
        for param in self.parameters():
            param.allreduce = True
            param.tensor_model_parallel = False
            param.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.skip_bias_add:
            return F.linear(x, self.weight), self.bias
        return F.linear(x, self.weight, self.bias), None


def _data_parallel_stream():
    """The RNG stream TE draws duplicated weights in (the same on every TP rank); none before
    Megatron's tracker is seeded (a unit check)."""
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        get_data_parallel_rng_tracker_name,
    )

    tracker, name = get_cuda_rng_tracker(), get_data_parallel_rng_tracker_name()
    return tracker.fork(name) if name in tracker.get_states() else nullcontext()


def install_latent_projections() -> None:
    """Lets `MoELayer` build its latent projections without Transformer Engine."""
    from megatron.core.transformer.moe import moe_layer

    moe_layer.HAVE_TE = True
    moe_layer.TELinear = DuplicatedLinear

"""The gated group RMSNorm of a Mamba2 mixer in plain torch, for CPU ranks (mamba-ssm's
`RMSNorm` in `ops/triton/layernorm_gated.py` is a Triton kernel).

The channels are split into groups of `group_size` (one group when None); each group is scaled
by the reciprocal root mean square of its own values, then by `weight` (plus `bias`). With a gate
z: `norm(x) * silu(z)` when `norm_before_gate`, else `norm(x * silu(z))`. Megatron uses one group
per Mamba group (`group_size = d_inner / ngroups`, `megatron/core/ssm/mamba_mixer.py:417-423`),
which keeps the norm the same under tensor parallelism, where each rank holds whole groups.
Computed in float32 (float64 for float64 inputs), returned in x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """The gated group RMSNorm of the last dim of x (any leading shape; z like x)."""
    channels = x.shape[-1]
    group_size = channels if group_size is None else group_size
    if group_size < 1 or channels % group_size:
        raise ValueError(f"group_size {group_size} does not divide the {channels} channels")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z has shape {tuple(z.shape)}, expected {tuple(x.shape)}")
    dtype = torch.float64 if torch.float64 in (x.dtype, weight.dtype) else torch.float32
    values = x.to(dtype)
    gate = None if z is None else F.silu(z.to(dtype))
    if gate is not None and not norm_before_gate:
        values = values * gate
    grouped = values.reshape(*values.shape[:-1], channels // group_size, group_size)
    scale = torch.rsqrt(grouped.square().mean(dim=-1, keepdim=True) + eps)
    out = (grouped * scale).reshape(values.shape) * weight.to(dtype)
    if bias is not None:
        out = out + bias.to(dtype)
    if gate is not None and norm_before_gate:
        out = out * gate
    return out.to(x.dtype)


class GatedRMSNorm(torch.nn.Module):
    """Drop-in for mamba-ssm's `RMSNorm` (`ops/triton/layernorm_gated.py`): same constructor,
    parameters (`weight`, no bias) and `forward(x, z=None)`."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm_gated(
            x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
            norm_before_gate=self.norm_before_gate,
        )

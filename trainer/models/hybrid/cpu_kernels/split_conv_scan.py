"""mamba-ssm's `mamba_split_conv1d_scan_combined` for CPU ranks, composed from the torch kernels
here: split the input projection into z, xBC and dt; causal conv1d with SiLU over xBC; split x,
B and C; the SSD scan with softplus(dt + dt_bias); the gate (inside the scan, or through the
gated group RMSNorm when its weight is given); the optional output projection.

It is the call Megatron's training path makes by default (`use_mamba_mem_eff_path`,
`megatron/core/ssm/mamba_mixer.py:755-775`). mamba-ssm's version is one autograd function that
recomputes the conv and the scan in backward to save memory; this one keeps autograd's saved
tensors instead (same values, more memory), which is what a CPU test backend can afford.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.models.hybrid.cpu_kernels.causal_conv import causal_conv1d_fn
from trainer.models.hybrid.cpu_kernels.gated_norm import rms_norm_gated
from trainer.models.hybrid.cpu_kernels.ssd_scan import mamba_chunk_scan_combined


def _widths(zxbcdt, conv1d_weight, D, headdim, ngroups) -> tuple[int, int, int, int]:
    """(heads, headdim, d_state, d_nonssm) read from the shapes, as mamba-ssm does."""
    if D.dim() == 1:
        if headdim is None:
            raise ValueError("headdim must be given when D has one dim (one value per head)")
        heads = D.shape[0]
    else:
        heads, headdim = D.shape
    if heads % ngroups:
        raise ValueError(f"{heads} heads are not divisible by ngroups={ngroups}")
    dim = heads * headdim
    d_state = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * d_state - heads) // 2
    expected = 2 * d_nonssm + 2 * dim + 2 * ngroups * d_state + heads
    if d_state < 1 or d_nonssm < 0 or zxbcdt.shape[-1] != expected:
        raise ValueError(
            f"zxbcdt's last dim {zxbcdt.shape[-1]} does not split into z, x, B, C, dt for "
            f"{heads} heads x {headdim}, {ngroups} groups and conv width {conv1d_weight.shape[0]}"
        )
    return heads, headdim, d_state, d_nonssm


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
    state_dtype: torch.dtype | None = None,
):
    """zxbcdt [b, l, 2*d_nonssm + 2*heads*headdim + 2*ngroups*d_state + heads] -> out
    [b, l, d_nonssm + heads*headdim] (or the output projection's width), and the final SSM
    states with `return_final_states`; the arguments mean what they mean in mamba-ssm."""
    heads, headdim, d_state, d_nonssm = _widths(zxbcdt, conv1d_weight, D, headdim, ngroups)
    dim = heads * headdim
    batch, length, _ = zxbcdt.shape
    zx0, z, xBC, dt = torch.split(
        zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * d_state, heads], dim=-1
    )
    xBC = causal_conv1d_fn(
        xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx=seq_idx, activation=activation
    ).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * d_state, ngroups * d_state], dim=-1)
    z = z.reshape(batch, length, heads, headdim)
    gate_in_scan = rmsnorm_weight is None
    scanned = mamba_chunk_scan_combined(
        x.reshape(batch, length, heads, headdim),
        dt,
        A,
        B.reshape(batch, length, ngroups, d_state),
        C.reshape(batch, length, ngroups, d_state),
        chunk_size,
        D=D,
        z=z if gate_in_scan else None,
        dt_bias=dt_bias,
        initial_states=initial_states,
        seq_idx=seq_idx,
        dt_softplus=True,
        dt_limit=dt_limit,
        return_final_states=return_final_states,
        state_dtype=state_dtype,
    )
    y, final_states = scanned if return_final_states else (scanned, None)
    y = y.reshape(batch, length, dim)
    if not gate_in_scan:
        y = rms_norm_gated(
            y, rmsnorm_weight, None, z=z.reshape(batch, length, dim), eps=rmsnorm_eps,
            group_size=dim // ngroups, norm_before_gate=norm_before_gate,
        )
    if d_nonssm > 0:
        gate, value = zx0.chunk(2, dim=-1)
        y = torch.cat([F.silu(gate) * value, y], dim=-1)
    if outproj_weight is not None:
        y = F.linear(y, outproj_weight, outproj_bias)
    elif outproj_bias is not None:
        raise ValueError("outproj_bias was given without outproj_weight")
    return (y, final_states) if return_final_states else y

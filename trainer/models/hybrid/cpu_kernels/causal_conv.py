"""The causal depthwise conv1d of a Mamba2 mixer in plain torch, for CPU ranks (the CUDA
extension behind causal-conv1d's `causal_conv1d_fn` does not build or run without CUDA).

Channel d of output position t is  bias_d + sum_k weight[d, k] * x[d, t - (width - 1) + k],
optionally through SiLU. Taps before the start of the row read `initial_states` (or zeros).
With `seq_idx` (packed documents) a tap counts only when its position has the same index as t,
so no document sees the previous one, and positions with a negative index (padding) give 0,
as causal-conv1d does. Computed in float32 (float64 for float64 inputs), returned in x's dtype;
gradients come from autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "swish")


def _check(x, weight, bias, seq_idx, initial_states, return_final_states, activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    batch, dim, length = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({dim}, width)")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({dim},)")
    if seq_idx is not None:
        if tuple(seq_idx.shape) != (batch, length):
            raise ValueError(
                f"seq_idx has shape {tuple(seq_idx.shape)}, expected ({batch}, {length})"
            )
        if initial_states is not None or return_final_states:
            # The same contract as causal-conv1d: states are per row, seq_idx splits rows.
            raise ValueError("seq_idx cannot be combined with initial_states or final states")
    width = weight.shape[1]
    if initial_states is not None and tuple(initial_states.shape) != (batch, dim, width - 1):
        raise ValueError(
            f"initial_states has shape {tuple(initial_states.shape)}, expected "
            f"({batch}, {dim}, {width - 1})"
        )


def _packed_conv(x: torch.Tensor, weight: torch.Tensor, seq_idx: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv of x [b, d, l] where tap k of position t counts only when
    seq_idx[t - (width - 1) + k] == seq_idx[t]; no bias."""
    width = weight.shape[1]
    windows = F.pad(x, (width - 1, 0)).unfold(-1, width, 1)  # [b, d, l, width]
    ids = seq_idx.to(torch.long)
    # Positions before the row get an index no document has.
    padded_ids = F.pad(ids, (width - 1, 0), value=int(ids.min()) - 1).unfold(-1, width, 1)
    same = (padded_ids == ids[..., None]).to(x.dtype)  # [b, l, width]
    return torch.einsum("bdlk,blk,dk->bdl", windows, same, weight)


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
):
    """causal-conv1d's `causal_conv1d_fn` (same arguments and results) in torch.

    x [b, dim, l], weight [dim, width], bias [dim], seq_idx [b, l], initial_states
    [b, dim, width - 1]. Returns out [b, dim, l], and with `return_final_states` also the last
    width - 1 inputs [b, dim, width - 1] (written into `final_states_out` when given).
    """
    _check(x, weight, bias, seq_idx, initial_states, return_final_states, activation)
    dtype = torch.float64 if torch.float64 in (x.dtype, weight.dtype) else torch.float32
    width = weight.shape[1]
    inputs = x.to(dtype)
    if initial_states is not None:
        inputs = torch.cat([initial_states.to(dtype), inputs], dim=-1)
    else:
        inputs = F.pad(inputs, (width - 1, 0))
    kernel = weight.to(dtype)
    if seq_idx is None:
        out = F.conv1d(inputs, kernel[:, None, :], groups=kernel.shape[0])
    else:
        out = _packed_conv(x.to(dtype), kernel, seq_idx)
    if bias is not None:
        out = out + bias.to(dtype)[:, None]
    if activation is not None:
        out = F.silu(out)
    if seq_idx is not None:
        out = out * (seq_idx >= 0).to(dtype)[:, None, :]
    out = out.to(x.dtype).contiguous()
    if not return_final_states:
        return out
    final = inputs[..., inputs.shape[-1] - (width - 1):].to(x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final

"""The chunked SSD scan of a Mamba2 mixer in plain torch, for CPU ranks (mamba-ssm's Triton
`mamba_chunk_scan_combined` does not run without CUDA).

Per head h, with dt the discretised step and A = -exp(A_log) (Megatron passes A already
negated, `megatron/core/ssm/mamba_mixer.py:742`), the recurrence over positions t is

    state_t = exp(dt_t * A_h) * state_{t-1} + dt_t * x_t B_t^T        (state: headdim x d_state)
    y_t     = state_t C_t + D_h * x_t,  then  y_t * silu(z_t) when z is given

It is computed the chunked way (the "state space duality" form): inside a chunk the outputs are
one masked matrix product; between chunks only the state is carried. `seq_idx` marks packed
documents: the state is reset wherever the index changes, so nothing crosses a document
boundary (a run of equal indices is one document; the initial state belongs to index 0, as in
mamba-ssm). Everything is accumulated in float32 (float64 for float64 inputs) and the output is
cast back to x's dtype; the carried states are stored in `state_dtype` (default C's dtype), as
mamba-ssm stores them. Gradients come from autograd.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32, or float64 when any given tensor is float64."""
    dtypes = [t.dtype for t in tensors if t is not None]
    return torch.float64 if torch.float64 in dtypes else torch.float32


def discretize_dt(
    dt: torch.Tensor,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    dtype: torch.dtype,
) -> torch.Tensor:
    """dt + dt_bias, softplus (linear above 20, as mamba-ssm), then clamped to `dt_limit`."""
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = F.softplus(dt, threshold=20.0)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def document_runs(seq_idx: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """[batch, length] int64: 0 for the run of tokens that continues the initial state, then
    +1 at every change of `seq_idx` along the row."""
    if seq_idx is None:
        return torch.zeros(batch, length, dtype=torch.long, device=device)
    seq_idx = seq_idx.to(torch.long)
    previous = F.pad(seq_idx[:, :-1], (1, 0), value=0)
    return torch.cumsum((seq_idx != previous).to(torch.long), dim=1)


def _pad_to_chunks(tensor: torch.Tensor, pad: int, value: float = 0.0) -> torch.Tensor:
    """`tensor` [batch, length, ...] padded at the end of the length dim by `pad`."""
    if pad == 0:
        return tensor
    widths = [0, 0] * (tensor.dim() - 2) + [0, pad]
    return F.pad(tensor, widths, value=value)


def _check_shapes(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx) -> None:
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    expected = {
        "dt": (dt.shape, (batch, length, heads)),
        "A": (A.shape, (heads,)),
        "B": (B.shape, (batch, length, groups, d_state)),
        "C": (C.shape, (batch, length, groups, d_state)),
    }
    if z is not None:
        expected["z"] = (z.shape, tuple(x.shape))
    if dt_bias is not None:
        expected["dt_bias"] = (dt_bias.shape, (heads,))
    if initial_states is not None:
        expected["initial_states"] = (initial_states.shape, (batch, heads, headdim, d_state))
    if seq_idx is not None:
        expected["seq_idx"] = (seq_idx.shape, (batch, length))
    for name, (got, want) in expected.items():
        if tuple(got) != tuple(want):
            raise ValueError(f"{name} has shape {tuple(got)}, expected {tuple(want)}")
    if D is not None and tuple(D.shape) not in ((heads,), (heads, headdim)):
        raise ValueError(
            f"D has shape {tuple(D.shape)}, expected ({heads},) or ({heads}, {headdim})"
        )
    if heads % groups:
        raise ValueError(f"{heads} heads are not divisible by {groups} groups")


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    state_dtype: torch.dtype | None = None,
):
    """mamba-ssm's `mamba_chunk_scan_combined` (same arguments and results) in torch.

    x [b, l, heads, headdim], dt [b, l, heads], A [heads], B and C [b, l, groups, d_state],
    D [heads] or [heads, headdim], z like x, dt_bias [heads], initial_states
    [b, heads, headdim, d_state], seq_idx [b, l]. Returns y like x, and the final states
    [b, heads, headdim, d_state] with `return_final_states`.
    """
    if return_varlen_states:
        raise ValueError(
            "return_varlen_states is not supported by the CPU SSD scan (Megatron Core's training "
            "and static prefill paths never ask for it); use seq_idx for packed documents"
        )
    del cu_seqlens  # read by mamba-ssm only together with return_varlen_states
    _check_shapes(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
    dtype = compute_dtype(x, B, C, initial_states)
    batch, length, heads, headdim = x.shape
    groups = B.shape[2]
    per_group = heads // groups
    chunks = max(1, -(-length // chunk_size))
    pad = chunks * chunk_size - length

    step = discretize_dt(dt, dt_bias, dt_softplus, dt_limit, dtype)
    runs = document_runs(seq_idx, batch, length, x.device)
    # Padding adds steps of dt = 0: no input, no decay, so the final state is unchanged.
    step = _pad_to_chunks(step, pad)
    runs = torch.cat([runs, runs[:, -1:].expand(batch, pad)], dim=1)
    xs = _pad_to_chunks(x.to(dtype), pad)
    Bs = _pad_to_chunks(B.to(dtype), pad)
    Cs = _pad_to_chunks(C.to(dtype), pad)

    shape = (batch, chunks, chunk_size)
    xs = xs.reshape(*shape, groups, per_group, headdim)
    Bs = Bs.reshape(*shape, groups, -1)
    Cs = Cs.reshape(*shape, groups, -1)
    step = step.reshape(*shape, groups, per_group)
    runs = runs.reshape(*shape)
    log_decay = torch.cumsum(step * A.to(dtype).reshape(groups, per_group), dim=2)

    # Inside each chunk: position i sees j <= i of the same document, decayed from j to i.
    same = runs[..., :, None] == runs[..., None, :]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    visible = (same & causal)[:, :, None, None]  # [b, c, 1, 1, i, j]
    cs = log_decay.permute(0, 1, 3, 4, 2)  # [b, c, g, r, Q]
    exponent = (cs[..., :, None] - cs[..., None, :]).masked_fill(~visible, -math.inf)
    weights = torch.exp(exponent) * step.permute(0, 1, 3, 4, 2)[..., None, :]
    scores = torch.einsum("bcign,bcjgn->bcgij", Cs, Bs)
    y = torch.einsum("bcgij,bcgrij,bcjgrp->bcigrp", scores, weights, xs)

    # Each chunk's own contribution to the state at its end, from its last document only.
    last_run = runs[..., -1]  # [b, c]
    to_end = torch.exp(cs[..., -1:] - cs) * step.permute(0, 1, 3, 4, 2)
    to_end = to_end * (runs == last_run[..., None])[:, :, None, None, :]
    chunk_states = torch.einsum("bcjgn,bcgrj,bcjgrp->bcgrpn", Bs, to_end, xs)

    # Between chunks: carry the state while the document goes on, reset it when it changed.
    run_before = F.pad(last_run[:, :-1], (1, 0), value=0)  # last run of the previous chunk
    carry = torch.exp(cs[..., -1]) * (last_run == run_before)[:, :, None, None]  # [b, c, g, r]
    store = state_dtype if state_dtype is not None else C.dtype
    if initial_states is None:
        state = xs.new_zeros(batch, groups, per_group, headdim, Bs.shape[-1])
    else:
        state = initial_states.to(dtype).reshape(batch, groups, per_group, headdim, -1)
    entering = []
    for chunk in range(chunks):
        entering.append(state.to(store).to(dtype))
        state = state * carry[:, chunk, ..., None, None] + chunk_states[:, chunk]
    entering = torch.stack(entering, dim=1)  # [b, c, g, r, p, n]

    continues = (runs == run_before[..., None])[..., None, None]  # [b, c, Q, 1, 1]
    from_before = torch.exp(log_decay) * continues
    y = y + torch.einsum("bcign,bcgrpn->bcigrp", Cs, entering) * from_before[..., None]

    y = y.reshape(batch, chunks * chunk_size, heads, headdim)[:, :length]
    if D is not None:
        skip = D.to(dtype)
        y = y + x.to(dtype) * (skip[:, None] if skip.dim() == 1 else skip)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    y = y.to(x.dtype).contiguous()
    if not return_final_states:
        return y
    return y, state.reshape(batch, heads, headdim, -1).to(store)

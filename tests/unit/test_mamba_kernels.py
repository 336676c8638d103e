"""The CPU Mamba kernels, each against a step-by-step recurrence written here (forward and
gradients, float32 and float64), their initial and final states, and packed rows (seq_idx)
against their documents run one at a time."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.models.hybrid.cpu_kernels.causal_conv import causal_conv1d_fn
from trainer.models.hybrid.cpu_kernels.gated_norm import GatedRMSNorm, rms_norm_gated
from trainer.models.hybrid.cpu_kernels.split_conv_scan import mamba_split_conv1d_scan_combined
from trainer.models.hybrid.cpu_kernels.ssd_scan import mamba_chunk_scan_combined

TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11}
DTYPES = [torch.float32, torch.float64]

# ---- step-by-step references ----------------------------------------------------------


def ssd_steps(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial=None, seq_idx=None,
              softplus=True, limit=(0.0, math.inf)):
    """One position at a time: the state decays by exp(dt * A), takes dt * x B^T, and is read
    out through C; it restarts from zero wherever seq_idx changes (index 0 continues `initial`)."""
    batch, length, heads, headdim = x.shape
    per_group = heads // B.shape[2]
    state = torch.zeros(batch, heads, headdim, B.shape[3], dtype=x.dtype)
    if initial is not None:
        state = state + initial
    outputs = []
    for t in range(length):
        if seq_idx is not None:
            before = seq_idx[:, t - 1] if t > 0 else torch.zeros_like(seq_idx[:, 0])
            restart = (seq_idx[:, t] != before).to(x.dtype)[:, None, None, None]
            state = state * (1 - restart)
        step = dt[:, t] + (dt_bias if dt_bias is not None else 0)
        step = torch.log1p(torch.exp(step)) if softplus else step
        step = step.clamp(*limit)  # [b, h]
        rows = []
        for head in range(heads):
            group = head // per_group
            decay = torch.exp(step[:, head] * A[head])[:, None, None]
            update = step[:, head, None, None] * x[:, t, head, :, None] * B[:, t, group, None, :]
            rows.append(decay * state[:, head] + update)
        state = torch.stack(rows, dim=1)
        y = torch.stack([state[:, h] @ C[:, t, h // per_group][:, :, None] for h in range(heads)],
                        dim=1)[..., 0]
        if D is not None:
            y = y + x[:, t] * (D[:, None] if D.dim() == 1 else D)
        if z is not None:
            y = y * z[:, t] * torch.sigmoid(z[:, t])
        outputs.append(y)
    return torch.stack(outputs, dim=1), state


def conv_steps(x, weight, bias=None, seq_idx=None, initial=None, silu=False):
    """out[:, d, t] = bias + sum_k weight[d, k] * input at t - (width - 1) + k, taps before the
    row from `initial`, taps from another document left out."""
    batch, dim, length = x.shape
    width = weight.shape[1]
    history = initial if initial is not None else torch.zeros(batch, dim, width - 1, dtype=x.dtype)
    full = torch.cat([history, x], dim=-1)
    out = torch.zeros_like(x)
    for t in range(length):
        total = bias.clone()[None].expand(batch, dim) if bias is not None else 0
        for k in range(width):
            source = t - (width - 1) + k
            tap = full[:, :, source + width - 1] * weight[:, k]
            if seq_idx is not None:
                same = (seq_idx[:, source] == seq_idx[:, t]) if source >= 0 else torch.zeros(
                    batch, dtype=torch.bool)
                tap = tap * same[:, None].to(x.dtype)
            total = total + tap
        out[:, :, t] = total * torch.sigmoid(total) if silu else total
    return out, full[:, :, -(width - 1):]


def norm_steps(x, weight, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """Each group of channels divided by its root mean square, one group at a time."""
    group_size = group_size or x.shape[-1]
    gate = None if z is None else z * torch.sigmoid(z)
    values = x * gate if gate is not None and not norm_before_gate else x
    pieces = []
    for start in range(0, x.shape[-1], group_size):
        piece = values[..., start:start + group_size]
        pieces.append(piece / torch.sqrt((piece ** 2).sum(-1, keepdim=True) / group_size + eps))
    out = torch.cat(pieces, dim=-1) * weight
    return out * gate if gate is not None and norm_before_gate else out


# ---- inputs ------------------------------------------------------------------------------


def scan_inputs(dtype, batch=2, length=11, heads=4, headdim=3, groups=2, d_state=5, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    return {
        "x": rand(batch, length, heads, headdim),
        "dt": rand(batch, length, heads, scale=0.5),
        "A": -torch.exp(rand(heads, scale=0.5)),  # as Megatron passes it: -exp(A_log)
        "B": rand(batch, length, groups, d_state),
        "C": rand(batch, length, groups, d_state),
        "D": rand(heads),
        "z": rand(batch, length, heads, headdim),
        "dt_bias": rand(heads, scale=0.5),
    }


def leaves(tensors):
    return {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in tensors.items()}


def assert_close(got, want, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def grads_of(tensors, output):
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64).to(output.dtype)
    (output * weights).sum().backward()
    return {k: v.grad for k, v in tensors.items() if v.requires_grad}


# ---- the SSD scan ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [4, 16])
def test_scan_matches_the_recurrence_forward_and_backward(dtype, chunk_size):
    base = scan_inputs(dtype)
    ours, ref = leaves(base), leaves(base)
    y = mamba_chunk_scan_combined(**{k: ours[k] for k in "x dt A B C".split()},
                                  chunk_size=chunk_size, D=ours["D"], z=ours["z"],
                                  dt_bias=ours["dt_bias"], dt_softplus=True)
    y_ref, _ = ssd_steps(**ref)
    assert y.dtype == dtype
    assert_close(y, y_ref, dtype)
    got, want = grads_of(ours, y), grads_of(ref, y_ref)
    for name in want:
        assert_close(got[name], want[name], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_initial_and_final_states_and_per_channel_D(dtype):
    base = scan_inputs(dtype)
    base["D"] = torch.randn(4, 3, dtype=torch.float64).to(dtype)
    base["initial"] = torch.randn(2, 4, 3, 5, dtype=torch.float64).to(dtype)
    ours, ref = leaves(base), leaves(base)
    y, final = mamba_chunk_scan_combined(
        ours["x"], ours["dt"], ours["A"], ours["B"], ours["C"], 4, D=ours["D"],
        dt_bias=ours["dt_bias"], initial_states=ours["initial"], dt_softplus=True,
        return_final_states=True)
    y_ref, final_ref = ssd_steps(**{k: v for k, v in ref.items() if k != "z"})
    assert_close(y, y_ref, dtype)
    assert_close(final, final_ref, dtype)
    got = grads_of(ours, y + 0 * final.sum())
    want = grads_of({k: v for k, v in ref.items() if k != "z"}, y_ref)
    assert_close(got["initial"], want["initial"], dtype)
    assert_close(got["A"], want["A"], dtype)


def test_scan_final_state_carries_the_next_segment_exactly():
    """Running a row in two halves, the second starting from the first's final state, is the
    same as running it whole."""
    base = scan_inputs(torch.float64, length=12)
    whole, whole_final = mamba_chunk_scan_combined(**{k: base[k] for k in "x dt A B C".split()},
                                                   chunk_size=4, dt_bias=base["dt_bias"],
                                                   dt_softplus=True, return_final_states=True)
    halves, state = [], None
    for part in (slice(0, 5), slice(5, 12)):
        sliced = {k: base[k][:, part] for k in "x dt B C".split()}
        y, state = mamba_chunk_scan_combined(**sliced, A=base["A"], chunk_size=4,
                                             dt_bias=base["dt_bias"], initial_states=state,
                                             dt_softplus=True, return_final_states=True)
        halves.append(y)
    assert_close(torch.cat(halves, dim=1), whole, torch.float64)
    assert_close(state, whole_final, torch.float64)


def test_scan_dt_limit_and_no_softplus_follow_the_recurrence():
    base = scan_inputs(torch.float64)
    names = "x dt A B C".split()
    y = mamba_chunk_scan_combined(**{k: base[k] for k in names}, chunk_size=4,
                                  dt_bias=base["dt_bias"], dt_softplus=True, dt_limit=(0.3, 0.9))
    y_ref, _ = ssd_steps(**{k: base[k] for k in names}, dt_bias=base["dt_bias"], limit=(0.3, 0.9))
    assert_close(y, y_ref, torch.float64)
    # Without softplus a negative dt is clamped to the lower limit 0: that position adds nothing.
    y = mamba_chunk_scan_combined(**{k: base[k] for k in names}, chunk_size=4)
    y_ref, _ = ssd_steps(**{k: base[k] for k in names}, softplus=False)
    assert_close(y, y_ref, torch.float64)


def packed_row(lengths, batch=1):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])[
        None].expand(batch, -1).contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_packed_row_equals_its_documents_one_by_one(dtype):
    lengths = [3, 6, 1, 5]  # boundaries inside, at the edge of and across chunks of 4
    base = scan_inputs(dtype, batch=1, length=sum(lengths))
    seq_idx = packed_row(lengths)
    ours = leaves(base)
    kwargs = {"chunk_size": 4, "dt_softplus": True}
    packed = mamba_chunk_scan_combined(**{k: ours[k] for k in "x dt A B C".split()}, D=ours["D"],
                                       z=ours["z"], dt_bias=ours["dt_bias"], seq_idx=seq_idx,
                                       **kwargs)
    alone = leaves(base)
    pieces, start = [], 0
    for n in lengths:
        part = slice(start, start + n)
        pieces.append(mamba_chunk_scan_combined(
            *(alone[k][:, part] for k in "x dt".split()), alone["A"],
            *(alone[k][:, part] for k in "B C".split()), D=alone["D"], z=alone["z"][:, part],
            dt_bias=alone["dt_bias"], **kwargs))
        start += n
    separate = torch.cat(pieces, dim=1)
    assert_close(packed, separate, dtype)
    got, want = grads_of(ours, packed), grads_of(alone, separate)
    for name in want:
        assert_close(got[name], want[name], dtype)
    # And the recurrence agrees, padding-free and with the state restarting at each document.
    assert_close(packed, ssd_steps(**base, seq_idx=seq_idx)[0], dtype)


def test_scan_packed_initial_state_belongs_to_the_first_document_only():
    lengths = [5, 7]
    base = scan_inputs(torch.float64, batch=1, length=12)
    base.pop("z")
    initial = torch.randn(1, 4, 3, 5, dtype=torch.float64)
    seq_idx = packed_row(lengths)
    y, final = mamba_chunk_scan_combined(**{k: base[k] for k in "x dt A B C".split()},
                                         chunk_size=4, D=base["D"], dt_bias=base["dt_bias"],
                                         initial_states=initial, seq_idx=seq_idx,
                                         dt_softplus=True, return_final_states=True)
    y_ref, final_ref = ssd_steps(**base, initial=initial, seq_idx=seq_idx)
    assert_close(y, y_ref, torch.float64)
    assert_close(final, final_ref, torch.float64)  # the last document's state
    second = mamba_chunk_scan_combined(*(base[k][:, 5:] for k in "x dt".split()), base["A"],
                                       *(base[k][:, 5:] for k in "B C".split()), chunk_size=4,
                                       D=base["D"], dt_bias=base["dt_bias"], dt_softplus=True)
    assert_close(y[:, 5:], second, torch.float64)


def test_scan_gradcheck_float64():
    base = scan_inputs(torch.float64, batch=1, length=6, heads=2, headdim=2, groups=1, d_state=2)
    base["initial"] = torch.randn(1, 2, 2, 2, dtype=torch.float64)
    names = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial"]
    seq_idx = packed_row([4, 2])

    def scan(x, dt, A, B, C, D, z, dt_bias, initial):
        return mamba_chunk_scan_combined(x, dt, A, B, C, 4, D=D, z=z, dt_bias=dt_bias,
                                         initial_states=initial, seq_idx=seq_idx,
                                         dt_softplus=True, return_final_states=True)

    assert torch.autograd.gradcheck(scan, tuple(leaves(base)[k] for k in names))


def test_scan_refuses_what_it_does_not_do():
    base = scan_inputs(torch.float32)
    names = "x dt A B C".split()
    with pytest.raises(ValueError, match="return_varlen_states"):
        mamba_chunk_scan_combined(**{k: base[k] for k in names}, chunk_size=4,
                                  return_varlen_states=True)
    with pytest.raises(ValueError, match="dt has shape"):
        mamba_chunk_scan_combined(base["x"], base["dt"][:, :3], *(base[k] for k in "A B C".split()),
                                  chunk_size=4)


# ---- the causal conv1d -------------------------------------------------------------------


def conv_inputs(dtype, batch=2, dim=6, length=9, width=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) for k, shape in {
        "x": (batch, dim, length), "weight": (dim, width), "bias": (dim,),
        "initial": (batch, dim, width - 1)}.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_conv_matches_the_recurrence_with_initial_and_final_states(dtype, activation):
    base = conv_inputs(dtype)
    ours, ref = leaves(base), leaves(base)
    out, final = causal_conv1d_fn(ours["x"], ours["weight"], ours["bias"],
                                  initial_states=ours["initial"], return_final_states=True,
                                  activation=activation)
    out_ref, final_ref = conv_steps(ref["x"], ref["weight"], ref["bias"], initial=ref["initial"],
                                    silu=activation is not None)
    assert_close(out, out_ref, dtype)
    assert torch.equal(final, final_ref)
    got, want = grads_of(ours, out), grads_of(ref, out_ref)
    for name in want:
        assert_close(got[name], want[name], dtype)


def test_conv_final_state_of_a_short_row_is_zero_padded():
    base = conv_inputs(torch.float64, length=2)
    buffer = torch.empty(2, 6, 3, dtype=torch.float64)
    out, final = causal_conv1d_fn(base["x"], base["weight"], return_final_states=True,
                                  final_states_out=buffer)
    assert final is buffer
    assert torch.equal(final[..., :1], torch.zeros(2, 6, 1, dtype=torch.float64))
    assert torch.equal(final[..., 1:], base["x"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_packed_row_equals_its_documents_one_by_one(dtype):
    lengths = [2, 5, 1, 4]  # documents shorter and longer than the width of 4
    base = conv_inputs(dtype, batch=1, length=sum(lengths))
    seq_idx = packed_row(lengths)
    ours, alone = leaves(base), leaves(base)
    packed = causal_conv1d_fn(ours["x"], ours["weight"], ours["bias"], seq_idx=seq_idx,
                              activation="silu")
    separate = torch.cat([causal_conv1d_fn(piece, alone["weight"], alone["bias"], activation="silu")
                          for piece in torch.split(alone["x"], lengths, dim=-1)], dim=-1)
    assert_close(packed, separate, dtype)
    assert_close(packed, conv_steps(base["x"], base["weight"], base["bias"], seq_idx=seq_idx,
                                    silu=True)[0], dtype)
    got, want = grads_of(ours, packed), grads_of(alone, separate)
    for name in ("x", "weight", "bias"):
        assert_close(got[name], want[name], dtype)


def test_conv_padding_positions_give_zero_and_gradcheck():
    base = conv_inputs(torch.float64, batch=1, dim=3, length=7)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, -1, -1]], dtype=torch.int32)
    out = causal_conv1d_fn(base["x"], base["weight"], base["bias"], seq_idx=seq_idx)
    assert torch.equal(out[..., 5:], torch.zeros(1, 3, 2, dtype=torch.float64))
    inputs = tuple(leaves(base)[k] for k in ("x", "weight", "bias"))
    assert torch.autograd.gradcheck(
        lambda x, w, b: causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation="silu"), inputs)
    with pytest.raises(ValueError, match="seq_idx cannot be combined"):
        causal_conv1d_fn(base["x"], base["weight"], seq_idx=seq_idx, return_final_states=True)
    with pytest.raises(ValueError, match="activation must be"):
        causal_conv1d_fn(base["x"], base["weight"], activation="gelu")


# ---- the gated group RMSNorm -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("group_size", [None, 4])
def test_norm_matches_the_groupwise_formula(dtype, norm_before_gate, group_size):
    g = torch.Generator().manual_seed(0)
    base = {k: torch.randn(3, 5, 12, generator=g, dtype=torch.float64).to(dtype)
            for k in ("x", "z")}
    base["weight"] = torch.randn(12, generator=g, dtype=torch.float64).to(dtype)
    ours, ref = leaves(base), leaves(base)
    out = rms_norm_gated(ours["x"], ours["weight"], z=ours["z"], eps=1e-5, group_size=group_size,
                         norm_before_gate=norm_before_gate)
    out_ref = norm_steps(ref["x"], ref["weight"], z=ref["z"], eps=1e-5, group_size=group_size,
                         norm_before_gate=norm_before_gate)
    assert_close(out, out_ref, dtype)
    got, want = grads_of(ours, out), grads_of(ref, out_ref)
    for name in want:
        assert_close(got[name], want[name], dtype)


def test_norm_module_is_mamba_ssm_shaped_and_gradchecks():
    norm = GatedRMSNorm(8, eps=1e-5, group_size=4, norm_before_gate=False, dtype=torch.float64)
    assert [name for name, _ in norm.named_parameters()] == ["weight"]
    assert torch.equal(norm.weight, torch.ones(8, dtype=torch.float64)) and norm.bias is None
    x = torch.randn(2, 8, dtype=torch.float64)
    assert_close(norm(x), norm_steps(x, norm.weight, group_size=4, eps=1e-5), torch.float64)
    inputs = (x.requires_grad_(), torch.randn(2, 8, dtype=torch.float64, requires_grad=True),
              torch.randn(8, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(
        lambda x, z, w: rms_norm_gated(x, w, z=z, group_size=4, norm_before_gate=False), inputs)
    with pytest.raises(ValueError, match="does not divide"):
        rms_norm_gated(x, norm.weight, group_size=3)


# ---- the composed training kernel --------------------------------------------------------


def split_inputs(dtype, batch=2, length=10, heads=4, headdim=2, groups=2, d_state=3, width=4):
    g = torch.Generator().manual_seed(3)
    dim = heads * headdim
    conv_dim = dim + 2 * groups * d_state

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    return {
        "zxbcdt": rand(batch, length, 2 * dim + 2 * groups * d_state + heads),
        "conv1d_weight": rand(conv_dim, width, scale=0.5),
        "conv1d_bias": rand(conv_dim, scale=0.1),
        "dt_bias": rand(heads, scale=0.5),
        "A": -torch.exp(rand(heads, scale=0.5)),
        "D": rand(heads),
    }


def split_by_hand(p, heads=4, headdim=2, groups=2, d_state=3, seq_idx=None, norm_weight=None):
    """The same pipeline spelled out from the step-by-step references above."""
    dim = heads * headdim
    z, xBC, dt = torch.split(p["zxbcdt"], [dim, dim + 2 * groups * d_state, heads], dim=-1)
    xBC = conv_steps(xBC.transpose(1, 2), p["conv1d_weight"], p["conv1d_bias"], seq_idx=seq_idx,
                     silu=True)[0].transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, groups * d_state, groups * d_state], dim=-1)
    b, length = x.shape[:2]
    z = z.reshape(b, length, heads, headdim)
    y, _ = ssd_steps(x.reshape(b, length, heads, headdim), dt, p["A"],
                     B.reshape(b, length, groups, d_state), C.reshape(b, length, groups, d_state),
                     D=p["D"], z=None if norm_weight is not None else z, dt_bias=p["dt_bias"],
                     seq_idx=seq_idx)
    y = y.reshape(b, length, dim)
    if norm_weight is not None:
        y = norm_steps(y, norm_weight, z=z.reshape(b, length, dim), group_size=dim // groups,
                       norm_before_gate=False)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_conv_scan_is_conv_then_scan_then_gate(dtype):
    """Megatron's training call (mamba_mixer.py:755-775): gate inside the scan, no norm weight,
    D per head, and a packed row."""
    base = split_inputs(dtype, batch=1)
    seq_idx = packed_row([4, 6])
    ours, ref = leaves(base), leaves(base)
    out = mamba_split_conv1d_scan_combined(**ours, chunk_size=4, activation="silu", headdim=2,
                                           ngroups=2, norm_before_gate=False, seq_idx=seq_idx)
    out_ref = split_by_hand(ref, seq_idx=seq_idx)
    assert out.shape == (1, 10, 8)
    assert_close(out, out_ref, dtype)
    got, want = grads_of(ours, out), grads_of(ref, out_ref)
    for name in want:
        assert_close(got[name], want[name], dtype)


def test_split_conv_scan_with_norm_weight_and_output_projection():
    base = split_inputs(torch.float64)
    norm_weight = torch.randn(8, dtype=torch.float64)
    proj = torch.randn(5, 8, dtype=torch.float64)
    out = mamba_split_conv1d_scan_combined(**base, chunk_size=4, headdim=2, ngroups=2,
                                           rmsnorm_weight=norm_weight, rmsnorm_eps=1e-6,
                                           norm_before_gate=False, outproj_weight=proj)
    want = F.linear(split_by_hand(base, norm_weight=norm_weight), proj)
    assert_close(out, want, torch.float64)
    with pytest.raises(ValueError, match="does not split"):
        mamba_split_conv1d_scan_combined(base["zxbcdt"][..., :-1],
                                         *(base[k] for k in list(base)[1:]), chunk_size=4,
                                         headdim=2, ngroups=2)

"""The torch Mamba kernels of the CPU runtime against mamba-ssm's and causal-conv1d's own GPU
kernels on the same CUDA tensors, forward and backward, fp32 and bf16, with packed documents,
initial and final states, and the fused training call as Megatron makes it
(`megatron/core/ssm/mamba_mixer.py:755-775`). If the libraries are missing, each test is
failed with one line saying which and how to install them (the `gpu` extra): on a GPU machine
the tier must not pass without them (without CUDA, tests/gpu/conftest.py skips it)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from trainer.models.hybrid.cpu_kernels.causal_conv import causal_conv1d_fn
from trainer.models.hybrid.cpu_kernels.gated_norm import rms_norm_gated
from trainer.models.hybrid.cpu_kernels.split_conv_scan import mamba_split_conv1d_scan_combined
from trainer.models.hybrid.cpu_kernels.ssd_scan import mamba_chunk_scan_combined

LIBRARIES = ("mamba_ssm", "causal_conv1d")
MISSING = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]


@pytest.fixture(autouse=True)
def _kernels_installed():
    if MISSING:
        pytest.fail(f"{' and '.join(MISSING)} not installed on this GPU machine: the Mamba kernel "
                    "comparison needs mamba-ssm and causal-conv1d (pip install -e '.[gpu]'; "
                    "docs/cpu-runtime.md, the mamba_kernels patch)", pytrace=False)


# Relative to the largest reference value: Triton's fp32 matmuls may run in TF32.
TOLERANCE = {torch.float32: 1e-2, torch.bfloat16: 5e-2}
DTYPES = [torch.float32, torch.bfloat16]
BATCH, LENGTH, HEADS, HEADDIM, GROUPS, D_STATE, CHUNK, WIDTH = 2, 300, 8, 64, 2, 64, 64, 4


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-6)
            ).item()


def pair(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Two independent leaf copies: one for our kernel, one for the library's."""
    def copy():
        return {k: v.detach().clone().requires_grad_(v.is_floating_point())
                for k, v in tensors.items()}
    return copy(), copy()


def compare(ours: dict, theirs: dict, out, out_ref, dtype) -> None:
    weights = torch.randn(out_ref.shape, device="cuda", generator=torch.Generator("cuda")
                          .manual_seed(1)).to(out_ref.dtype)
    (out * weights).sum().backward()
    (out_ref * weights).sum().backward()
    errors = {"out": relative_error(out, out_ref)}
    errors.update({f"d{k}": relative_error(ours[k].grad, theirs[k].grad)
                   for k in theirs if theirs[k].grad is not None})
    print(dtype, {k: f"{v:.2e}" for k, v in errors.items()})
    bad = {k: v for k, v in errors.items() if v > TOLERANCE[dtype]}
    assert not bad, f"beyond {TOLERANCE[dtype]} relative: {bad}"


def packed_seq_idx() -> torch.Tensor:
    lengths = [70, 1, 129, 100]  # boundaries inside, on and across chunk edges
    row = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])
    return row[None].expand(BATCH, -1).contiguous().cuda()


def scan_tensors(dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator("cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=g) * scale

    return {
        "x": rand(BATCH, LENGTH, HEADS, HEADDIM).to(dtype),
        "dt": rand(BATCH, LENGTH, HEADS, scale=0.5).to(dtype),
        "A": -torch.exp(rand(HEADS, scale=0.5)),
        "B": rand(BATCH, LENGTH, GROUPS, D_STATE).to(dtype),
        "C": rand(BATCH, LENGTH, GROUPS, D_STATE).to(dtype),
        "D": rand(HEADS),
        "z": rand(BATCH, LENGTH, HEADS, HEADDIM).to(dtype),
        "dt_bias": rand(HEADS, scale=0.5),
        "initial_states": rand(BATCH, HEADS, HEADDIM, D_STATE, scale=0.1),
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_ssd_scan_matches_mamba_ssm(dtype):
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as reference

    ours, theirs = pair(scan_tensors(dtype))
    kwargs = {"chunk_size": CHUNK, "seq_idx": packed_seq_idx(), "dt_softplus": True,
              "dt_limit": (0.0, float("inf")), "return_final_states": True}
    out, final = mamba_chunk_scan_combined(**ours, **kwargs)
    out_ref, final_ref = reference(**theirs, **kwargs)
    assert relative_error(final, final_ref) < TOLERANCE[dtype]
    compare(ours, theirs, out, out_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_conv1d_matches_causal_conv1d(dtype):
    from causal_conv1d import causal_conv1d_fn as reference

    g = torch.Generator("cuda").manual_seed(0)
    dim = HEADS * HEADDIM
    # causal-conv1d takes seq_idx only in the channel-last layout: [b, l, d] transposed.
    x = torch.randn(BATCH, LENGTH, dim, device="cuda", generator=g).to(dtype).transpose(1, 2)
    tensors = {"x": x, "weight": torch.randn(dim, WIDTH, device="cuda", generator=g),
               "bias": torch.randn(dim, device="cuda", generator=g)}
    ours, theirs = pair(tensors)
    seq_idx = packed_seq_idx()
    out = causal_conv1d_fn(**ours, seq_idx=seq_idx, activation="silu")
    out_ref = reference(**theirs, seq_idx=seq_idx, activation="silu")
    compare(ours, theirs, out, out_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_gated_rmsnorm_matches_mamba_ssm(dtype, norm_before_gate):
    from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn as reference

    g = torch.Generator("cuda").manual_seed(0)
    dim = HEADS * HEADDIM
    tensors = {"x": torch.randn(BATCH * LENGTH, dim, device="cuda", generator=g).to(dtype),
               "z": torch.randn(BATCH * LENGTH, dim, device="cuda", generator=g).to(dtype),
               "weight": torch.rand(dim, device="cuda", generator=g) + 0.5}
    ours, theirs = pair(tensors)
    kwargs = {"eps": 1e-5, "group_size": dim // GROUPS, "norm_before_gate": norm_before_gate}
    out = rms_norm_gated(ours["x"], ours["weight"], None, z=ours["z"], **kwargs)
    out_ref = reference(theirs["x"], theirs["weight"], None, z=theirs["z"], **kwargs)
    compare(ours, theirs, out, out_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_conv_scan_matches_mamba_ssm_as_megatron_calls_it(dtype):
    from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined as reference

    g = torch.Generator("cuda").manual_seed(0)
    dim = HEADS * HEADDIM
    conv_dim = dim + 2 * GROUPS * D_STATE
    tensors = {
        "zxbcdt": torch.randn(BATCH, LENGTH, conv_dim + dim + HEADS, device="cuda",
                              generator=g).to(dtype),
        "conv1d_weight": (torch.randn(conv_dim, WIDTH, device="cuda", generator=g) * 0.5).to(dtype),
        "conv1d_bias": (torch.randn(conv_dim, device="cuda", generator=g) * 0.1).to(dtype),
        "dt_bias": torch.randn(HEADS, device="cuda", generator=g) * 0.5,
        "A": -torch.exp(torch.randn(HEADS, device="cuda", generator=g) * 0.5),
        "D": torch.randn(HEADS, device="cuda", generator=g),
    }
    ours, theirs = pair(tensors)
    kwargs = {"chunk_size": CHUNK, "activation": "silu", "headdim": HEADDIM, "ngroups": GROUPS,
              "norm_before_gate": False, "seq_idx": packed_seq_idx()}
    compare(ours, theirs, mamba_split_conv1d_scan_combined(**ours, **kwargs),
            reference(**theirs, **kwargs), dtype)

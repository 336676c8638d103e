"""Megatron Core's own `MambaMixer` on CPU with the torch kernels installed by the CPU runtime:
built from a TransformerConfig with local linear layers on a one-rank gloo group, forward and
backward, against the step-by-step references of test_mamba_kernels.py (which also pins the
argument conventions: A = -exp(A_log), D per head, the conv weight layout, dt_bias); a packed
row against its documents run alone; the non-fused path against the fused one; and the same
weights in transformers' `NemotronHMamba2Mixer` (its own PyTorch path), an implementation
nobody here wrote.

The runtime is process-wide, so everything runs in one fresh process, once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.hang import HANG_S

REPO_ROOT = Path(__file__).resolve().parents[2]
DIMS = {"hidden": 16, "heads": 4, "headdim": 4, "groups": 2, "d_state": 4, "chunk": 4}


def build_mixer(mem_eff: bool = True):
    import torch
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=DIMS["hidden"], num_attention_heads=2,
        mamba_state_dim=DIMS["d_state"], mamba_head_dim=DIMS["headdim"],
        mamba_num_groups=DIMS["groups"], mamba_num_heads=DIMS["heads"],
        use_mamba_mem_eff_path=mem_eff, use_cpu_initialization=True,
        params_dtype=torch.float32, add_bias_linear=False,
    )
    torch.manual_seed(0)
    mixer = MambaMixer(
        config,
        MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
        d_model=DIMS["hidden"], chunk_size=DIMS["chunk"], layer_number=1,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"]),
    )
    with torch.no_grad():  # away from the defaults, so that every parameter matters
        mixer.D.uniform_(-1, 1)
        mixer.norm.weight.uniform_(0.5, 1.5)
        mixer.conv1d_bias.uniform_(-0.2, 0.2)
    return mixer


def by_hand(mixer, hidden):
    """The mixer's forward from the step-by-step references and its own parameters."""
    from tests.unit.test_mamba_kernels import norm_steps, split_by_hand

    zxbcdt = mixer.in_proj(hidden)[0].transpose(0, 1)  # [b, l, width]
    params = {"zxbcdt": zxbcdt, "conv1d_weight": mixer.conv1d_weight[:, 0],
              "conv1d_bias": mixer.conv1d_bias, "dt_bias": mixer.dt_bias,
              "A": -mixer.A_log.exp(), "D": mixer.D}
    y = split_by_hand(params, heads=DIMS["heads"], headdim=DIMS["headdim"],
                      groups=DIMS["groups"], d_state=DIMS["d_state"])
    y = norm_steps(y, mixer.norm.weight, eps=1e-5,
                   group_size=DIMS["heads"] * DIMS["headdim"] // DIMS["groups"])
    return mixer.out_proj(y.transpose(0, 1))[0]


def hf_mixer_like(mixer):
    """transformers' NemotronH Mamba2 mixer with `mixer`'s weights (TP1: same layouts).

    transformers 5.24 clamps dt from below at `time_step_min` (`modeling_nemotron_h.py`,
    `time_step_limit = (config.time_step_min, inf)`), Megatron at 0 (no dt_limit is passed,
    `mamba_mixer.py:755-775`): the test sets time_step_min=0 so both compute the same function.
    """
    import torch
    from transformers.models.nemotron_h.configuration_nemotron_h import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    config = NemotronHConfig(
        hidden_size=DIMS["hidden"], num_hidden_layers=1, layer_types=["mamba"],
        mamba_num_heads=DIMS["heads"], mamba_head_dim=DIMS["headdim"], n_groups=DIMS["groups"],
        ssm_state_size=DIMS["d_state"], conv_kernel=4, chunk_size=2 * DIMS["chunk"],
        layer_norm_epsilon=1e-5, use_conv_bias=True, use_bias=False, time_step_min=0.0,
        mamba_hidden_act="silu", vocab_size=32, num_attention_heads=2, num_key_value_heads=2,
    )
    hf = NemotronHMamba2Mixer(config, layer_idx=0)
    names = {"in_proj.weight": "in_proj.weight", "conv1d.weight": "conv1d_weight",
             "conv1d.bias": "conv1d_bias", "dt_bias": "dt_bias", "A_log": "A_log", "D": "D",
             "norm.weight": "norm.weight", "out_proj.weight": "out_proj.weight"}
    ours = dict(mixer.named_parameters())
    with torch.no_grad():
        for hf_name, param in hf.named_parameters():
            param.copy_(ours[names[hf_name]])
    return hf, names


def grads(mixer, output, weights):
    mixer.zero_grad(set_to_none=True)
    (output * weights).sum().backward()
    return {name: p.grad.clone() for name, p in mixer.named_parameters()}


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run_checks(store: str) -> dict:
    import torch
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from trainer.cpu_runtime.runtime import activate_cpu_runtime

    activate_cpu_runtime(threads_per_rank=1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0,
                                         world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1)
    result: dict = {}
    mixer = build_mixer()
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(10, 2, DIMS["hidden"], generator=g)  # [l, b, hidden]
    weights = torch.randn(10, 2, DIMS["hidden"], generator=g)
    out, bias = mixer(hidden)
    result["shape"] = list(out.shape)
    result["bias_is_none"] = bias is None
    got = grads(mixer, out, weights)
    result["grads_nonzero"] = sorted(k for k, v in got.items() if v.abs().sum() > 0)
    result["params"] = sorted(got)
    want_out = by_hand(mixer, hidden)
    want = grads(mixer, want_out, weights)
    result["forward_vs_steps"] = (out - want_out).abs().max().item()
    result["grads_vs_steps"] = max_diff(got, want)

    # A packed row of two documents (Megatron's seq_idx from cu_seqlens and total_tokens)
    # against each document on its own.
    row = hidden[:, :1]
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=torch.tensor([0, 3, 10]),
                             cu_seqlens_kv=torch.tensor([0, 3, 10]), max_seqlen_q=7,
                             max_seqlen_kv=7, total_tokens=10)
    packed = mixer(row, packed_seq_params=params)[0]
    packed_grads = grads(mixer, packed, weights[:, :1])
    alone = torch.cat([mixer(row[:3])[0], mixer(row[3:])[0]])
    result["packed_vs_alone"] = (packed - alone).abs().max().item()
    result["packed_grads_vs_alone"] = max_diff(packed_grads, grads(mixer, alone, weights[:, :1]))
    result["packed_vs_unpacked"] = (packed - mixer(row)[0]).abs().max().item()

    # transformers' NemotronH mixer, same weights: outputs, input and weight gradients.
    hf, names = hf_mixer_like(mixer)
    for mode in ("train", "eval"):
        getattr(hf, mode)()
        ours_in, hf_in = (hidden.clone().requires_grad_() for _ in range(2))
        ours_out = mixer(ours_in)[0]
        hf_out = hf(hf_in.transpose(0, 1)).transpose(0, 1)
        ours_grads, hf_grads = grads(mixer, ours_out, weights), grads(hf, hf_out, weights)
        result[f"hf_{mode}_forward"] = (ours_out - hf_out).abs().max().item()
        result[f"hf_{mode}_input_grad"] = (ours_in.grad - hf_in.grad).abs().max().item()
        result[f"hf_{mode}_weight_grads"] = max(
            (ours_grads[ours_name] - hf_grads[hf_name]).abs().max().item()
            for hf_name, ours_name in names.items())

    # The non-fused path (causal_conv1d_fn, mamba_chunk_scan_combined, norm(y, z)).
    from megatron.core.ssm import mamba_mixer

    calls = []

    def counted(name, kernel):
        return lambda *args, **kwargs: calls.append(name) or kernel(*args, **kwargs)

    for name in ("causal_conv1d_fn", "mamba_chunk_scan_combined"):
        setattr(mamba_mixer, name, counted(name, getattr(mamba_mixer, name)))
    plain = build_mixer(mem_eff=False)
    plain.load_state_dict(mixer.state_dict())
    result["non_fused_vs_fused"] = (plain(hidden)[0] - mixer(hidden)[0]).abs().max().item()
    result["non_fused_calls"] = calls
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def outcome() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        code = (f"import json; from tests.unit.test_mamba_mixer_cpu import run_checks; "
                f"print(json.dumps(run_checks({str(Path(tmp) / 'store')!r})))")
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=HANG_S)
    if done.returncode != 0:
        raise RuntimeError(f"mixer process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])



def test_mixer_builds_and_trains_on_cpu(outcome):
    assert outcome["shape"] == [10, 2, DIMS["hidden"]] and outcome["bias_is_none"]
    # Every parameter of the mixer gets a gradient: in/out projections, conv, dt_bias, A_log, D,
    # the gated norm's weight.
    assert outcome["grads_nonzero"] == outcome["params"]
    assert "norm.weight" in outcome["params"] and "A_log" in outcome["params"]


def test_mixer_equals_the_step_by_step_pipeline(outcome):
    assert outcome["forward_vs_steps"] < 1e-5
    assert outcome["grads_vs_steps"] < 1e-4


def test_mixer_packed_row_equals_its_documents_alone(outcome):
    assert outcome["packed_vs_alone"] < 1e-5
    assert outcome["packed_grads_vs_alone"] < 1e-4
    # Without seq_idx the second document would see the first.
    assert outcome["packed_vs_unpacked"] > 1e-3


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_mixer_equals_transformers_nemotron_h_mixer(outcome, mode):
    assert outcome[f"hf_{mode}_forward"] < 1e-5
    assert outcome[f"hf_{mode}_input_grad"] < 1e-5
    assert outcome[f"hf_{mode}_weight_grads"] < 1e-4


def test_mixer_non_fused_path_equals_the_fused_one(outcome):
    assert outcome["non_fused_calls"] == ["causal_conv1d_fn", "mamba_chunk_scan_combined"]
    assert outcome["non_fused_vs_fused"] < 1e-5

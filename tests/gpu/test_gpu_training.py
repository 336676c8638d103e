"""On a GPU node: the same trainer runs on CUDA (NCCL, TE layers when Transformer Engine is
installed) and the CPU runtime stays off."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


def _train(tmp_path, *overrides: str, recipe: str = "tiny_dp1",
           steps: int = 40) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), f"recipe={recipe}",
         f"run_dir={tmp_path}", f"train.train_iters={steps}", f"train.eval_interval={steps // 2}",
         "scheduler.warmup_iters=5", "data.source=synthetic", *overrides],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )


def refused_and_failed(result: subprocess.CompletedProcess, line: str, missing: list[str]) -> None:
    """On a GPU machine without `missing`: the run must have been refused before launch in one
    line starting `line`, and the tier fails all the same (a GPU machine without Transformer
    Engine or the Mamba kernels cannot check what this tier is for)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(line), result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    pytest.fail(f"{', '.join(missing)} not installed on this GPU machine (the refusal was "
                "right): bring the wheels, WHEELS=dir bash scripts/run_gpu_checks.sh",
                pytrace=False)


def missing(*names: str) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


@pytest.mark.parametrize("impl", ["local", "auto"])
def test_tiny_run_trains_on_one_gpu(tmp_path, impl):
    """Megatron's local layers when asked for; Transformer Engine's (the default on GPUs) with
    its fusions when TE is installed, else refused before launch in one line (and the tier
    fails)."""
    result = _train(tmp_path, f"model.transformer_impl={impl}")
    if impl == "auto" and missing("transformer_engine"):
        refused_and_failed(result, "error: model.transformer_impl=auto builds Transformer "
                           "Engine's layers on GPUs", missing("transformer_engine"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("layers: Transformer Engine's; fusions on:" in result.stdout) == (impl == "auto")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["backend"] == "GPU (nccl)"
    heldout = [r["loss"] for r in records if r["kind"] == "heldout"]
    assert heldout[-1] < heldout[0] - 0.5


def test_tiny_hybrid_trains_50_steps_on_one_gpu(tmp_path):
    """The tiny hybrid (Mamba2, attention, MLP, MoE) on CUDA through mamba-ssm's and
    causal-conv1d's kernels (Megatron's local layers: Transformer Engine is optional here); without
    those kernels it is refused before launch in one line naming them (and the tier fails)."""
    result = _train(tmp_path, "model.transformer_impl=local", recipe="hybrid_tiny_dp1", steps=50)
    kernels = missing("mamba_ssm", "causal_conv1d")
    if kernels:
        refused_and_failed(result, "error: model.hybrid_layer_pattern has Mamba layers", kernels)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["backend"] == "GPU (nccl)"
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 50 and losses[-1] < losses[0] - 1.0


def test_tiny_super_trains_in_bf16_on_one_gpu(tmp_path):
    """The tiny Nemotron 3 Super-shaped hybrid (latent MoE, two MTP depths sharing a layer) in
    BF16 on CUDA, each MTP depth's loss logged; its latent projections are Transformer Engine's
    linears whatever the layers, so without mamba-ssm and causal-conv1d, or without TE, it is
    refused before launch in one line naming what is missing (and the tier fails)."""
    result = _train(tmp_path, "model.transformer_impl=local", "precision.dtype=bf16",
                    recipe="super_tiny_dp1", steps=50)
    kernels = missing("mamba_ssm", "causal_conv1d")
    if kernels or missing("transformer_engine"):
        refused_and_failed(result, "error: model.hybrid_layer_pattern has Mamba layers"
                           if kernels else "error: model.moe_latent_size=32 builds",
                           kernels + missing("transformer_engine"))
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 50 and train[-1]["loss"] < train[0]["loss"] - 1.0
    assert all({"mtp_1_loss", "mtp_2_loss"} <= set(r["extra"]) for r in train)


def test_cpu_runtime_auto_stays_off_with_cuda():
    from recipes.config.schema import ClusterConfig
    from trainer.cpu_runtime.runtime import cpu_runtime_active, runtime_for

    assert runtime_for(ClusterConfig(device="auto")).device == "cuda"
    assert not cpu_runtime_active()


def test_cpu_run_on_a_machine_with_transformer_engine(tmp_path):
    """`cluster.device=cpu` beside an installed Transformer Engine: Megatron binds TE's CUDA-only
    FusedAdam, multi-tensor kernels and router GEMM at import, and the CPU runtime binds its
    torch fallbacks back (trainer/cpu_runtime/no_te_kernels.py), so a MoE trains on CPU ranks as it
    does without TE."""
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.fail("transformer_engine not installed on this GPU machine: this test is the "
                    "CPU runtime beside it (bring the wheels: WHEELS=dir bash "
                    "scripts/run_gpu_checks.sh)")
    result = _train(tmp_path, "cluster.device=cpu", recipe="mixtral_tiny_ep1", steps=10)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["backend"].startswith("CPU")
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 10 and losses[-1] < losses[0]

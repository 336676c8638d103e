"""On one GPU with Transformer Engine: a tiny MoE (GPT) and a tiny hybrid MoE train through
`scripts/pretrain.py` with the GPU fast paths Megatron Bridge turns on (grouped-GEMM experts,
fused permutation, Transformer Engine's CUDA graphs; the hybrid also the fused weighted squared
ReLU) and without them; each pair's tokens/s is reported. Where Transformer Engine or the Mamba
kernels are missing on a GPU machine these tests fail (they do not pass on a refusal): the
fast paths are what this tier checks.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
WARMUP = 8  # steps left out of tokens/s: TE's kernel choice, the graphs' warm-up and capture
SIZE = ["precision.dtype=bf16", "model.hidden_size=512", "model.num_attention_heads=8",
        "model.num_query_groups=8", "model.seq_length=1024", "model.vocab_size=2048",
        "train.micro_batch_size=4", "train.global_batch_size=16", "data.source=synthetic",
        "scheduler.warmup_iters=5", "train.eval_interval=0", "train.eval_iters=0",
        "checkpoint.save=false", "logging.progress_bar=false", "logging.log_interval=10"]
MOE = ["model.num_moe_experts=8", "model.moe_ffn_hidden_size=512", "model.ffn_hidden_size=512"]
GRAPHS = ["train.cuda_graphs=transformer_engine", "train.cuda_graph_warmup_steps=3"]
CASES = {
    "moe_gpt": ("mixtral_tiny_ep1", MOE, [
        "model.moe_grouped_gemm=true", "model.moe_permute_fusion=true", *GRAPHS,
        "train.cuda_graph_modules=[attn]"]),
    "moe_hybrid": ("hybrid_tiny_dp1", [*MOE, "model.mamba_num_heads=16",
                                       "model.mamba_head_dim=64", "model.mamba_state_dim=64",
                                       "model.mamba_chunk_size=128"], [
        "model.moe_permute_fusion=true", "model.moe_fused_squared_relu=true", *GRAPHS,
        "train.cuda_graph_modules=[attn,mamba]"]),
}


def missing_kernels(hybrid: bool) -> list[str]:
    """What this tier needs and a GPU machine may lack (none may be missing here)."""
    needed = ["transformer_engine"] + (["mamba_ssm", "causal_conv1d"] if hybrid else [])
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _train(run_dir: Path, recipe: str, overrides: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), f"recipe={recipe}",
         f"run_dir={run_dir}", f"train.train_iters={STEPS}", *SIZE, *overrides],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def tokens_per_s(records: list[dict]) -> float:
    return statistics.median(r["tokens_per_s"] for r in records[WARMUP:])


@pytest.mark.parametrize("case", list(CASES))
def test_fast_paths_train_and_report_their_speed(case, tmp_path, capsys):
    recipe, model, fast = CASES[case]
    missing = missing_kernels(hybrid=case == "moe_hybrid")
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed on this GPU machine: the fast paths "
                    "need them (bring the wheels: WHEELS=dir bash scripts/run_gpu_checks.sh)")
    runs = {}
    for name, overrides in (("without", model), ("with", [*model, *fast])):
        result = _train(tmp_path / name, recipe, overrides)
        assert result.returncode == 0, f"{case} {name}: {result.stderr[-3000:]}"
        runs[name] = (result.stdout, _records(tmp_path / name))
    losses = {name: statistics.fmean(r["loss"] for r in recs[-10:])
              for name, (_, recs) in runs.items()}
    speed = {name: tokens_per_s(recs) for name, (_, recs) in runs.items()}
    # The figures first, so a failed check below still shows what both runs measured.
    with capsys.disabled():
        print(f"\n{case}: {speed['without']:,.0f} tokens/s without the fast paths, "
              f"{speed['with']:,.0f} with them (x{speed['with'] / speed['without']:.2f}; "
              f"{' '.join(fast)}); last-10 loss {losses['without']:.4f} vs "
              f"{losses['with']:.4f}", flush=True)
    stdout = runs["with"][0]
    assert "fast paths: " in stdout and "CUDA graphs (transformer_engine" in stdout
    assert "CUDA graphs: captured" in stdout, stdout[-3000:]
    assert "layers: Transformer Engine's; fusions on:" in stdout
    # The same model and batches; grouped GEMM and the fused kernels only reorder sums.
    assert losses["with"] == pytest.approx(losses["without"], rel=0.05)

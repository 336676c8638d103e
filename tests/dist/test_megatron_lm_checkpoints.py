"""Moving a run between Megatron-LM and this trainer, both ways, on checkpoints each tool's own
save wrote (tests/dist/megatron_lm_runs.py: Megatron-LM's loop is `megatron.training.pretrain`
from the wheel, driven as the parity check drives it).

- Megatron-LM -> here: `checkpoint.load=<Megatron-LM's iter_N>` resumes weights, optimizer
  state, schedule, step, consumed samples and RNG streams, and the steps after it equal
  Megatron-LM's own uninterrupted run (lr and grad norm bit for bit at fp32, losses within one
  fp32 rounding, final weights bit-identical): GPT on one rank with attention dropout (whose
  streams must resume), TP2 x PP2 and DP2 with the distributed optimizer in both of its
  formats; the hybrid on one rank and over TP2 (sequence parallel) x PP2 with the distributed
  optimizer, its first stage without MoE layers; a step shaped as Megatron Bridge saves it too.
- Here -> Megatron-LM: `checkpoint.format=megatron_lm` writes a checkpoint Megatron-LM's
  `--load` resumes to the same steps as this trainer's uninterrupted run.
- Before any rank starts: the pre-flight reads Megatron-LM's saved arguments, states what a
  resume changes and refuses a model of another shape in one line; `scripts/pretrain.py`
  resumes a Megatron-LM `--save` directory end to end.

All cases share one launch each (the module's `runs`): 4 steps, the checkpoint after step 2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dist.layout_runs import HYBRID_SIZE, TEST_DATA
from tests.hang import HANG_S

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
STEPS, SAVE_AT = 4, 2
CASES = {
    # recipe, ranks, overrides, also a Megatron Bridge-shaped step
    "gpt_dp1_dropout": ("tiny_dp1", 1, ["model.attention_dropout=0.1"], True),
    "gpt_tp2_pp2_distopt": ("tiny_tp2_pp2", 4, ["optimizer.distributed=true"], False),
    "gpt_dp2_distopt_fully_reshardable": (
        "tiny_dp2_distopt", 2, ["checkpoint.optimizer_format=fully_reshardable"], False),
    "hybrid_dp1": ("hybrid_tiny_dp1", 1, HYBRID_SIZE, False),
    "hybrid_tp2_pp2_distopt": ("hybrid_tiny_pp2", 4, [
        *HYBRID_SIZE, "cluster.gpus_per_node=4", "parallel.tensor=2",
        "parallel.sequence_parallel=true", "optimizer.distributed=true"], False),
}


@pytest.fixture(scope="module")
def runs(launch_ranks, tmp_path_factory):
    """Each case's launch, once per module, on first use: its run directory and result."""
    done: dict[str, tuple[Path, dict]] = {}

    def run(case: str) -> tuple[Path, dict]:
        if case not in done:
            recipe, ranks, overrides, bridge = CASES[case]
            run_dir = tmp_path_factory.mktemp(case)
            results = launch_ranks(ranks, "tests.dist.megatron_lm_runs:both_ways", {
                "recipe": recipe, "overrides": overrides, "steps": STEPS, "save_at": SAVE_AT,
                "run_dir": str(run_dir), "bridge": bridge})
            done[case] = run_dir, results[0]  # every rank reduced its figures over the world
        return done[case]
    return run


def _fp32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def assert_same_steps(resumed: dict, uninterrupted: dict, after: int) -> None:
    """The resumed run's steps equal the uninterrupted run's from step `after + 1`: lr and grad
    norm exactly at fp32 (Megatron-LM reports fp32), the loss within one fp32 rounding
    (Megatron-LM divides its fp32 sum in fp32)."""
    expected = {key: values[after:] for key, values in uninterrupted.items()}
    assert len(resumed["losses"]) == len(uninterrupted["losses"]) - after
    assert resumed["lrs"] == expected["lrs"]
    assert [_fp32(g) for g in resumed["grad_norms"]] == [_fp32(g) for g in
                                                        expected["grad_norms"]]
    for mine, theirs in zip(resumed["losses"], expected["losses"], strict=True):
        assert abs(_fp32(mine) - _fp32(theirs)) < 1e-6


@pytest.mark.parametrize("case", list(CASES))
def test_this_trainer_resumes_a_megatron_lm_checkpoint_exactly(runs, case):
    _, result = runs(case)
    assert result["start"] == SAVE_AT
    assert_same_steps(result["ours_resumed"], result["theirs"], SAVE_AT)
    assert result["ours_resumed_vs_theirs"] == {"max_diff": 0.0, "tensors_differ": 0}


@pytest.mark.parametrize("case", list(CASES))
def test_megatron_lm_resumes_this_trainers_checkpoint_exactly(runs, case):
    _, result = runs(case)
    assert_same_steps(result["theirs_resumed"], result["ours"], SAVE_AT)
    assert result["theirs_resumed_vs_ours"] == {"max_diff": 0.0, "tensors_differ": 0}


def test_format_megatron_lm_names_the_step_as_megatron_lm_does(runs):
    _, result = runs("gpt_dp1_dropout")
    assert result["ours_files"] == ["iter_0000002", "latest", "latest_checkpointed_iteration.txt"]
    assert result["theirs_files"] == ["iter_0000002", "iter_0000004",
                                      "latest_checkpointed_iteration.txt"]


def test_a_megatron_bridge_shaped_step_resumes_exactly(runs):
    _, result = runs("gpt_dp1_dropout")
    assert result["bridge_start"] == SAVE_AT
    assert_same_steps(result["bridge_resumed"], result["theirs"], SAVE_AT)
    assert result["bridge_resumed_vs_theirs"] == {"max_diff": 0.0, "tensors_differ": 0}


def _config(run_dir: Path, *overrides: str):
    from recipes.resolve import resolve_config

    return resolve_config(["recipe=tiny_dp1", *TEST_DATA, "model.attention_dropout=0.1",
                           f"checkpoint.load={run_dir / 'megatron_lm'}", *overrides])


def test_the_preflight_reads_megatron_lms_arguments(runs):
    """In the launching process, without torch: the step, samples and writer; a changed batch
    and lr stated; another TP grid's RNG said in one line; another shape refused in one."""
    from plugins.protocol.errors import ConfigError
    from trainer.checkpoint.preflight import checkpoint_preflight, resumed_step

    run_dir, _ = runs("gpt_dp1_dropout")
    cfg = _config(run_dir, "train.global_batch_size=16", "optimizer.lr=1e-3")
    notes = checkpoint_preflight(cfg)
    assert resumed_step(cfg) == 4  # the tracker names iter_0000004
    assert notes[0].startswith(f"resuming from {run_dir / 'megatron_lm' / 'iter_0000004'} "
                               "(step 4, 32 samples; written by Megatron-LM, checkpoint version "
                               "3.0;")
    assert notes[1].startswith("changed since the save: train.global_batch_size 8 -> 16, "
                               "optimizer.lr 0.003 -> 0.001;")
    notes = checkpoint_preflight(_config(run_dir, "parallel.tensor=2", "cluster.gpus_per_node=2"))
    assert notes[-1].startswith("RNG streams: saved over PP1 x TP1, this run is PP1 x TP2;")
    with pytest.raises(ConfigError) as refused:
        checkpoint_preflight(_config(run_dir, "model.ffn_hidden_size=512"))
    assert str(refused.value) == (
        f"checkpoint.load={run_dir / 'megatron_lm'} (Megatron-LM's) does not fit this run's "
        "model: it was saved with model.ffn_hidden_size=256, this run has "
        "model.ffn_hidden_size=512; use the saved value, or start from another checkpoint")


def _pretrain(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), "recipe=tiny_dp1", *TEST_DATA,
         "model.attention_dropout=0.1", f"checkpoint.load={run_dir / 'megatron_lm'}",
         "logging.progress_bar=false", *overrides],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)


def test_pretrain_resumes_a_megatron_lm_save_directory(runs, tmp_path):
    run_dir, _ = runs("gpt_dp1_dropout")
    done = _pretrain(run_dir, "train.train_iters=6", "scheduler.warmup_iters=2",
                     f"run_dir={tmp_path / 'run'}", "logging.log_interval=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resume: resuming from" in done.stdout and "(step 4, 32 samples;" in done.stdout
    assert "resume: changed since the save: train.train_iters 300 -> 6" in done.stdout
    assert "step     5/6" in done.stdout and "step     6/6" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_another_shape_is_refused_before_any_rank_starts(runs, tmp_path):
    run_dir, _ = runs("gpt_dp1_dropout")
    done = _pretrain(run_dir, "model.num_layers=2", f"run_dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: checkpoint.load={run_dir / 'megatron_lm'} (Megatron-LM's) does not fit this "
        "run's model: it was saved with model.num_layers=4, this run has model.num_layers=2; "
        "use the saved value, or start from another checkpoint"]
    assert not (tmp_path / "run").exists()  # refused before the run directory, before ranks


def test_megatron_lm_needs_the_load_path_fixes_for_the_distributed_optimizer_on_cpu(
        launch_ranks, tmp_path):
    """`megatron_lm_on_cpu`'s megatron_lm_distributed_optimizer_load patch: without it
    Megatron-LM's `load_checkpoint` of a distributed-optimizer checkpoint fails on CPU (Megatron
    Core's `assert len(steps) == 1` on the torch-Adam branch); with it the steps resume."""
    result = launch_ranks(1, "tests.dist.megatron_lm_runs:distributed_optimizer_load", {
        "recipe": "tiny_dp1", "overrides": ["optimizer.distributed=true"], "steps": 3,
        "save_at": 2, "run_dir": str(tmp_path)})[0]
    assert result["without"] is not None and result["without"].startswith("AssertionError")
    assert_same_steps(result["with"], result["ours"], 2)

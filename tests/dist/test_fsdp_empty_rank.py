"""Megatron FSDP with a rank that holds no shard of a whole bucket trains, saves fsdp_dtensor and
resumes bit for bit; without `empty_shard_optimizer_state` that rank's state dict would lack the
Adam state of every parameter of the bucket (the save then hangs, see fsdp_runs.py).

Megatron FSDP buckets each layer's expert parameters apart from its other parameters (named
`.experts.`, `_get_parameter_groups` in megatron_fsdp/param_and_grad_buffer.py), pads a bucket
to DP whole rows of its widest parameter and gives each rank an equal run of rows
(`build_data_parallel_buffer_index`, `_get_dp_buffer_shard_bucket_index`). Two experts of
width 1 are four rows of `hidden_size`: at DP3 each shard is two rows, and the last rank's is
only padding. The test reads that from Megatron FSDP's buffer rather than assuming it.
"""

from __future__ import annotations

import pytest

from tests.dist.test_fsdp import _saved_adam_steps

pytestmark = pytest.mark.dist

RUNS = "tests.dist.fsdp_empty_rank_runs"
RECIPE, RANKS = "mixtral_tiny_ep1", 3
LAYOUT = [f"cluster.gpus_per_node={RANKS}", "optimizer.distributed=true",
          "optimizer.fsdp=optim_grads_params", "train.global_batch_size=6",
          "model.num_layers=1", "model.activation=gelu", "model.num_moe_experts=2",
          "model.moe_ffn_hidden_size=1"]
STEPS, SAVE_AFTER = 4, 2


@pytest.fixture(scope="module")
def saved(launch_ranks, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fsdp-empty-rank")
    ranks = launch_ranks(RANKS, f"{RUNS}:continuous", {
        "recipe": RECIPE, "overrides": LAYOUT, "steps": STEPS, "save_at": SAVE_AFTER,
        "run_dir": str(root / "run"), "checkpoint_dir": str(root / "checkpoints")})
    return {"checkpoints": root / "checkpoints", "ranks": ranks}


def _is_expert(name: str) -> bool:
    return ".experts." in name


def _ranks_without_expert_shards(ranks: list[dict]) -> list[int]:
    return [rank for rank, result in enumerate(ranks)
            if not any(size for name, size in result["sizes"].items() if _is_expert(name))]


def test_one_rank_holds_no_shard_of_the_expert_bucket(saved):
    ranks = saved["ranks"]
    empty = _ranks_without_expert_shards(ranks)
    print(f"ranks holding no expert shard: {empty}")
    assert empty and len(empty) < RANKS
    for rank in empty:
        assert any(ranks[rank]["sizes"].values())  # it holds shards of the other buckets


def test_without_the_fix_that_rank_lists_no_adam_state_for_the_bucket(saved):
    ranks = saved["ranks"]
    expert_state = [[key for key in result["unfixed"]
                     if key.startswith("optimizer.") and _is_expert(key)] for result in ranks]
    for rank in _ranks_without_expert_shards(ranks):
        assert expert_state[rank] == []
    assert any(expert_state)
    assert len({tuple(result["unfixed"]) for result in ranks}) > 1


def test_it_resumes_bit_for_bit(launch_ranks, tmp_path, saved):
    step = saved["checkpoints"] / f"step_{SAVE_AFTER:07d}"
    assert set(_saved_adam_steps(step).values()) == {float(SAVE_AFTER)}
    resumed = launch_ranks(RANKS, "tests.dist.resume_runs:resumed", {
        "recipe": RECIPE, "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": [*LAYOUT, f"checkpoint.load={saved['checkpoints']}"]})
    for rank, (before, after) in enumerate(zip(saved["ranks"], resumed, strict=True)):
        assert after["start"] == SAVE_AFTER
        assert after["records"] == before["records"][SAVE_AFTER:], f"rank {rank}"

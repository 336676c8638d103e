"""Save -> new processes -> load continues bit-identically to the uninterrupted run.

Covers the distributed optimizer's four load-path fixes in trainer/checkpointing.py: without
any one of them the resumed losses drift by ~1e-2 or the load fails. The run state comes back
whole: consumed samples and tokens, the data position, and each rank's RNG streams (the
dropout case differs from the first resumed step on without them).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.layout_runs"
STEPS, SAVE_AFTER = 5, 2

CASES = [
    ("tiny_dp2_distopt", 2, []),
    ("tiny_dp2_distopt", 2, ["checkpoint.optimizer_format=dp_reshardable"]),
    ("tiny_dp2_distopt", 2, ["precision.dtype=bf16"]),
    ("tiny_tp2_pp2", 4, []),
    ("tiny_dp2_distopt", 2, ["optimizer.overlap_grad_reduce=true",
                             "optimizer.overlap_param_gather=true"]),
    # Dropout draws from the CPU generator and Megatron's TP tracker: the RNG state must resume.
    ("tiny_tp2", 2, ["model.hidden_dropout=0.1", "model.attention_dropout=0.1"]),
]


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"), CASES,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in CASES],
)
def test_resumed_run_equals_uninterrupted_run(launch_ranks, tmp_path, recipe, ranks, overrides):
    checkpoints = tmp_path / "checkpoints"
    common = {"recipe": recipe, "steps": STEPS, "run_dir": str(tmp_path)}
    continuous = launch_ranks(ranks, f"{ENTRY}:train_save_continue", {
        **common, "overrides": overrides, "save_after": SAVE_AFTER,
        "checkpoint_dir": str(checkpoints),
    })[0]
    resumed = launch_ranks(ranks, f"{ENTRY}:resume_and_train", {
        **common, "overrides": [*overrides, f"checkpoint.load={checkpoints}"],
    })[0]
    assert resumed["start"] == SAVE_AFTER
    assert resumed["losses"] == continuous["losses"][SAVE_AFTER:]
    assert resumed["consumed"] == continuous["consumed"]

"""fp16 save and resume while the loss scaler has skipped every step so far.

Until its first update Adam has no state: the distributed optimizer's save then failed
(`DistributedOptimizer.state_dict`'s `assert len(steps) == 1`), and a plain optimizer's
checkpoint lacked the moments the resume's load template asks for (KeyError `optimizer.state.
exp_avg...`). The save now gives such an optimizer the zero state its first update starts from
(Megatron's `init_state_fn`, `megatron_fixes.optimizer_state_before_first_update`) and the
load restores its zero step (`state_dicts.zero_step_where_missing`). Megatron FSDP's
`fsdp_dtensor` save had the same gap (its resume asked DCP for a step and moments never written)
and kept no loss scaler at all (`fsdp_dtensor._grad_scaler_states`), and at DP2 stopped at the
first step (the step fix `fsdp_empty_shard_unscaling`, on every device; self-tested last). Here,
for plain Adam on one rank, the distributed optimizer on two and Megatron FSDP on one and on
two: an uninterrupted run saves after its first SAVE_AFTER steps, all skipped, and a second run
resumes from that save in fresh processes; every later step (losses, lr, grad norms, skips,
the scaler's scale and trackers) equals the uninterrupted run bit for bit, through updates whose
Adam moments and bias correction start from the resumed state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.precision_runs:train_recording_scaler"
STEPS, SAVE_AFTER = 8, 3
# At this scale the tiny model's steps 1-3 overflow (hysteresis 2: the first only counts
# down), step 4 applies (at the warm-up's lr 0), 5 overflows (not under Megatron FSDP), 6-8
# apply at a nonzero lr.
FP16 = [
    "precision.dtype=fp16", "precision.initial_loss_scale=1024", "precision.hysteresis=2",
    f"train.train_iters={STEPS}", "scheduler.warmup_iters=2", "checkpoint.save=true",
    f"checkpoint.save_interval={SAVE_AFTER}",
]
LAYOUTS = {"plain_adam": ("tiny_dp1", 1, []),
           "distributed_optimizer": ("tiny_dp2_distopt", 2, []),
           "megatron_fsdp": ("tiny_dp1", 1, ["optimizer.distributed=true",
                                             "optimizer.fsdp=optim_grads_params"]),
           "megatron_fsdp_dp2": ("tiny_dp2_fsdp", 2, [])}


def grad_norms(run_dir: Path) -> dict[int, str]:
    """Each logged step's grad norm, as metrics.jsonl writes it (a skipped step's is NaN)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: repr(r["grad_norm"]) for r in records if r.get("kind") == "train"}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def uninterrupted(request, launch_ranks, tmp_path_factory):
    recipe, nprocs, layout = LAYOUTS[request.param]
    run_dir = tmp_path_factory.mktemp(f"fp16_{request.param}")
    results = launch_ranks(nprocs, ENTRY, {"recipe": recipe, "overrides": [*layout, *FP16],
                                           "run_dir": str(run_dir)})
    return recipe, nprocs, layout, run_dir, results


def test_resume_from_a_save_before_the_first_update_continues_bit_for_bit(
        launch_ranks, uninterrupted, tmp_path):
    recipe, nprocs, layout, run_dir, continuous = uninterrupted
    steps = continuous[0]["steps"]
    assert [s["skipped"] for s in steps[:SAVE_AFTER]] == [True] * SAVE_AFTER  # no state yet
    applied_later = [s for s in steps[SAVE_AFTER:] if not s["skipped"] and s["lr"] > 0]
    assert len(applied_later) >= 2  # real updates after the save, seen in later losses
    checkpoint = run_dir / "checkpoints" / f"step_{SAVE_AFTER:07d}"
    assert checkpoint.is_dir()
    resumed = launch_ranks(nprocs, ENTRY, {
        "recipe": recipe, "overrides": [*layout, *FP16, f"checkpoint.load={checkpoint}"],
        "run_dir": str(tmp_path),
    })
    for rank in range(nprocs):
        at_save = continuous[rank]["steps"][SAVE_AFTER - 1]
        assert resumed[rank]["start"] == SAVE_AFTER
        assert resumed[rank]["loaded"] == {key: at_save[key] for key in resumed[rank]["loaded"]}
        assert resumed[rank]["steps"] == continuous[rank]["steps"][SAVE_AFTER:]
        assert resumed[rank]["skipped_steps"] == continuous[rank]["skipped_steps"]
        assert resumed[rank]["consumed"] == continuous[rank]["consumed"]
    later = {step: norm for step, norm in grad_norms(run_dir).items() if step > SAVE_AFTER}
    assert grad_norms(tmp_path) == later


def test_fp16_megatron_fsdp_at_dp2_needs_the_unscaling_patch(launch_ranks, tmp_path):
    """Without `fsdp_empty_shard_unscaling` the first fp16 step at DP2 stops in Megatron's
    unscaling (`_collect_main_grad_data_for_unscaling` reads the gradient Megatron FSDP gives
    no parameter whose shard on that rank is empty); with it, the run above trains."""
    ranks = launch_ranks(2, "tests.dist.fsdp_fp16_runs:fp16_step_without_patch", {
        "recipe": "tiny_dp2_fsdp", "run_dir": str(tmp_path), "overrides": FP16})
    errors = [rank["error"] for rank in ranks]
    assert any(errors), errors
    assert all(error is None or "'NoneType' object has no attribute 'data'" in error
               for error in errors), errors

"""fp16 with dynamic loss scaling on the CPU runtime (no Transformer Engine needed).

One uninterrupted run starts at a loss scale the tiny model's gradients overflow at: with
hysteresis 2 the first overflow only counts down, the next ones halve the scale; each such step
is skipped (no update, the lr scheduler does not move) and counted, and once the scale fits,
updates apply and the scale grows again after `loss_scale_window` clean steps. A second run
resumes from its mid-run checkpoint in fresh processes: the scaler's scale, growth tracker and
hysteresis tracker come back from the checkpoint, and every later step (losses, lr, skips,
scaler) equals the uninterrupted run bit for bit.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.precision_runs:train_recording_scaler"
STEPS, SAVE_AFTER, GLOBAL_BATCH = 10, 5, 2
INITIAL_SCALE = 1024  # the tiny model's first gradients overflow fp16 at this scale
FP16 = [
    "precision.dtype=fp16", f"precision.initial_loss_scale={INITIAL_SCALE}",
    "precision.hysteresis=2", "precision.loss_scale_window=3",
    f"train.train_iters={STEPS}", f"train.global_batch_size={GLOBAL_BATCH}",
    "scheduler.warmup_iters=2", "checkpoint.save=true", f"checkpoint.save_interval={SAVE_AFTER}",
]


@pytest.fixture(scope="module")
def uninterrupted(launch_ranks, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fp16_uninterrupted")
    result = launch_ranks(1, ENTRY, {"recipe": "tiny_dp1", "overrides": FP16,
                                     "run_dir": str(run_dir)})[0]
    return run_dir, result


def test_overflowing_steps_are_skipped_counted_and_leave_the_schedule(uninterrupted):
    _, run = uninterrupted
    steps = run["steps"]
    skipped = [s["step"] for s in steps if s["skipped"]]
    assert skipped and skipped[0] == 1  # the first step overflows at the initial scale
    assert run["skipped_steps"] == len(skipped)
    applied = [s["step"] for s in steps if not s["skipped"]]
    assert applied and applied[0] > skipped[0]  # once the scale fits, updates apply
    scales = [INITIAL_SCALE] + [s["scale"] for s in steps]
    previous_scheduler_steps, previous_lr = 0, 0.0  # warm-up starts the lr at 0
    for before, step in zip(scales[:-1], steps, strict=True):
        if step["skipped"]:
            # hysteresis 2: the first overflow counts down, every later one halves the scale
            assert step["scale"] == (before if step["step"] == 1 else before / 2)
            assert step["scheduler_steps"] == previous_scheduler_steps
            assert step["lr"] == previous_lr
        else:
            assert step["scheduler_steps"] == previous_scheduler_steps + GLOBAL_BATCH
        previous_scheduler_steps, previous_lr = step["scheduler_steps"], step["lr"]
    assert any(s["growth_tracker"] > 0 for s in steps)  # clean steps count towards growth
    assert any(after > before for before, after in pairwise(scales))  # and it grows


def test_resume_restores_the_scaler_and_continues_bit_for_bit(launch_ranks, uninterrupted,
                                                              tmp_path):
    run_dir, continuous = uninterrupted
    checkpoint = run_dir / "checkpoints" / f"step_{SAVE_AFTER:07d}"
    resumed = launch_ranks(1, ENTRY, {
        "recipe": "tiny_dp1", "overrides": [*FP16, f"checkpoint.load={checkpoint}"],
        "run_dir": str(tmp_path),
    })[0]
    at_save = continuous["steps"][SAVE_AFTER - 1]
    assert resumed["start"] == SAVE_AFTER
    assert resumed["loaded"] == {key: at_save[key] for key in resumed["loaded"]}
    assert resumed["loaded"] != {"scale": INITIAL_SCALE, "growth_tracker": 0,
                                 "hysteresis_tracker": 2}  # a state worth restoring
    assert resumed["steps"] == continuous["steps"][SAVE_AFTER:]
    assert resumed["skipped_steps"] == continuous["skipped_steps"]
    assert resumed["consumed"] == continuous["consumed"]

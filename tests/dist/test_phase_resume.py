"""A run in phases inside one launch: the trainer switches blend and global batch at the
boundary, and a resume just before, exactly at and just after it is bit-identical to the
uninterrupted run (per step: loss, lr, consumed tokens, the token ids trained on, the phase
and the tokens per source), on one rank and on two DP ranks. The tokens taken per blend source
follow the blend's weights.
"""

from __future__ import annotations

import pytest

from tests.dist.prepared_data import write_byte_dataset

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.resume_runs"
STEPS, BOUNDARY = 6, 3
STOPS = [BOUNDARY - 1, BOUNDARY, BOUNDARY + 1]  # just before, exactly at, just after
SECOND_WEIGHTS = {"general": 0.3, "quality": 0.7}


@pytest.fixture(scope="module")
def phased(tmp_path_factory) -> list[str]:
    """Two byte-level corpora; phase 1 trains on the first alone at batch 8, phase 2 on a
    30/70 blend of both at batch 16."""
    folder = tmp_path_factory.mktemp("phases")
    general = write_byte_dataset(folder, "general", seed=7)
    quality = write_byte_dataset(folder, "quality", seed=11)
    first, second = folder / "first.yaml", folder / "second.yaml"
    tail = "split: [90, 10]\neod_id: 0\nvocab_size: 256\n"
    first.write_text(f"train:\n  - {{prefix: {general}, weight: 1.0}}\n{tail}")
    second.write_text(f"train:\n  - {{prefix: {general}, weight: {SECOND_WEIGHTS['general']}}}"
                      f"\n  - {{prefix: {quality}, weight: {SECOND_WEIGHTS['quality']}}}\n{tail}")
    return ["data.source=blend", f"data.blend={first}", "scheduler.warmup_iters=1",
            f"train.train_iters={STEPS}", "scheduler.style=wsd",
            f"phases=[{{name: general, end_step: {BOUNDARY}}}, {{name: quality, end_step: "
            f"{STEPS}, blend: {second}, global_batch_size: 16, lr_decay: true}}]"]


@pytest.mark.parametrize(("recipe", "ranks"), [("tiny_dp1", 1), ("tiny_dp2", 2)])
def test_resume_around_a_phase_boundary_is_exact(launch_ranks, phased, tmp_path, recipe,
                                                  ranks):
    common = {"recipe": recipe, "steps": STEPS, "run_dir": str(tmp_path),
              "overrides": phased, "checkpoint_dir": str(tmp_path / "checkpoints")}
    continuous = launch_ranks(ranks, f"{ENTRY}:continuous", {**common, "save_at": STOPS})
    resumed = launch_ranks(ranks, f"{ENTRY}:stop_points",
                           {**common, "points": STOPS, "after": STEPS})
    for rank, (before, runs) in enumerate(zip(continuous, resumed, strict=True)):
        records = before["records"]
        assert [r["phase"] for r in records] == [0] * BOUNDARY + [1] * (STEPS - BOUNDARY)
        assert [r["samples"] for r in records] == [8, 16, 24, 40, 56, 72]  # batch 8, then 16
        for point in STOPS:
            assert runs[str(point)]["start"] == point
            assert runs[str(point)]["records"] == records[point:], (rank, point)
    first = continuous[0]["records"]
    # Phase 1 trains on the first corpus alone; phase 2 draws both at the blend's weights.
    assert set(first[BOUNDARY - 1]["sources"]) == {"general"}
    seq = 128
    second = {name: first[-1]["sources"].get(name, 0) - first[BOUNDARY - 1]["sources"].get(
        name, 0) for name in SECOND_WEIGHTS}
    total = (STEPS - BOUNDARY) * 16 * seq
    assert sum(second.values()) == total
    for name, weight in SECOND_WEIGHTS.items():
        assert abs(second[name] / total - weight) <= 2 / (total / seq), (name, second)


RAMP = ["train.global_batch_size=16", "train.rampup_batch_size=[4,4,24]", f"train.train_iters="
        f"{STEPS}", "scheduler.warmup_iters=1"]


def test_resume_in_the_middle_of_a_batch_ramp_is_exact(launch_ranks, tmp_path):
    """Megatron's calculator ramps 4 -> 8 -> 12 -> 16 over 24 samples on two DP ranks (one
    micro-batch each, then 2, 3, 4); resumes at steps 2 and 3 land inside the ramp."""
    stops = [2, 3]
    common = {"recipe": "tiny_dp2", "steps": STEPS, "run_dir": str(tmp_path), "overrides": RAMP,
              "checkpoint_dir": str(tmp_path / "checkpoints")}
    continuous = launch_ranks(2, f"{ENTRY}:continuous", {**common, "save_at": stops})
    resumed = launch_ranks(2, f"{ENTRY}:stop_points", {**common, "points": stops,
                                                       "after": STEPS})
    for before, runs in zip(continuous, resumed, strict=True):
        records = before["records"]
        assert [r["batch"] for r in records] == [4, 4, 8, 12, 16, 16]
        assert [r["samples"] for r in records] == [4, 8, 16, 28, 44, 60]
        for point in stops:
            assert runs[str(point)]["records"] == records[point:], point

"""Save -> new processes -> load continues exactly like the uninterrupted run.

Exactly means, per step after the resume: the same loss, learning rate and consumed tokens, bit
for bit, and the same token ids in the same order on every rank (a digest of each micro-batch).
Covers the distributed optimizer's load-path fixes (trainer/checkpoint/megatron_fixes.py;
without any one of them the resumed losses drift by ~1e-2 or the load fails), interleaved
pipelines, dropout (each rank's CPU generator and Megatron's tracker streams must resume), the
hybrid Mamba-Transformer model at EP2 with Nemotron 3's router expert bias, the tiny Super
(latent MoE and two shared MTP depths, their routers' bias and losses) at TP2 + SP x PP2 x EP2,
and ten random stop
points of the single-rank tiny model. A checkpoint saved at TP2 x PP2 resumes at other
layouts (weights and optimizer state resharded) within float tolerance, with the same samples;
so does the hybrid Mamba-Transformer model saved at TP2 + SP and resumed at PP2 x VPP2.
"""

from __future__ import annotations

import pytest

from tests.dist.layout_runs import HYBRID_SIZE
from tests.dist.resume_runs import random_points

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.resume_runs"
STEPS, SAVE_AFTER = 5, 2
RESHARD_TOLERANCE = 2e-5  # fp32 on CPU: layouts differ only in summation order
NEMOTRON3_ROUTING = [
    "model.moe_router_score_function=sigmoid", "model.moe_router_expert_bias=true",
    "model.moe_load_balancing=seq_aux_loss", "model.moe_aux_loss_coeff=1e-4",
    "model.moe_router_topk_scaling_factor=2.5", "model.moe_router_fp32=true",
    "model.moe_shared_expert_ffn_hidden_size=64", "model.activation=squared_relu",
]

CASES = [
    ("tiny_dp2_distopt", 2, []),
    ("tiny_dp2_distopt", 2, ["checkpoint.optimizer_format=fully_reshardable"]),
    ("tiny_dp2_distopt", 2, ["precision.dtype=bf16"]),
    ("tiny_tp2_pp2", 4, []),
    ("tiny_pp2_vpp2", 2, []),
    ("tiny_dp2_distopt", 2, ["optimizer.overlap_grad_reduce=true",
                             "optimizer.overlap_param_gather=true"]),
    # Dropout draws from the CPU generator and Megatron's TP tracker: the RNG state must resume.
    ("tiny_tp2", 2, ["model.hidden_dropout=0.1", "model.attention_dropout=0.1"]),
    # Nemotron 3's routing: the aux-loss-free expert bias is router state the steps move.
    ("mixtral_tiny_ep2_dp2", 2, NEMOTRON3_ROUTING),
    # The hybrid (Mamba2, attention, MLP, MoE routed as in Nemotron 3, expert bias included) with
    # its experts over EP2: the Mamba states, the scan's parameters and the router bias resume.
    ("hybrid_tiny_ep2_dp2", 2, HYBRID_SIZE),
    # The tiny Super (latent MoE, two MTP depths sharing a layer on the last of 2 stages, TP2 +
    # SP, EP2): the MTP depths' routers, their expert bias and each depth's loss resume too.
    ("super_tiny_tp2_sp_pp2_ep2", 4, HYBRID_SIZE),
]


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"), CASES,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in CASES],
)
def test_resumed_run_equals_uninterrupted_run(launch_ranks, tmp_path, recipe, ranks, overrides):
    checkpoints = tmp_path / "checkpoints"
    common = {"recipe": recipe, "steps": STEPS, "run_dir": str(tmp_path)}
    continuous = launch_ranks(ranks, f"{ENTRY}:continuous", {
        **common, "overrides": overrides, "save_at": [SAVE_AFTER],
        "checkpoint_dir": str(checkpoints),
    })
    resumed = launch_ranks(ranks, f"{ENTRY}:resumed", {
        **common, "overrides": [*overrides, f"checkpoint.load={checkpoints}"],
    })
    for rank, (before, after) in enumerate(zip(continuous, resumed, strict=True)):
        assert after["start"] == SAVE_AFTER
        assert after["records"] == before["records"][SAVE_AFTER:], f"rank {rank}"
        biases = [record["expert_bias"] for record in before["records"]]
        if "model.moe_router_expert_bias=true" in overrides or recipe.startswith(
                ("hybrid", "super")):
            assert len(set(biases)) == len(biases), "the expert bias moves every step"
        if recipe.startswith("super"):
            assert all(set(r["mtp"]) == {"mtp_1_loss", "mtp_2_loss"} for r in after["records"])


def test_ten_random_stop_points_resume_exactly(launch_ranks, tmp_path):
    steps = 12
    points = random_points(seed=7, last=steps, count=10)
    common = {"recipe": "tiny_dp1", "steps": steps, "run_dir": str(tmp_path),
              "checkpoint_dir": str(tmp_path / "checkpoints")}
    continuous = launch_ranks(1, f"{ENTRY}:continuous", {**common, "save_at": points})[0]
    after = 2  # steps trained after each resume (the continuation is what can drift)
    runs = launch_ranks(1, f"{ENTRY}:stop_points", {**common, "points": points, "after": after})[0]
    for point in points:
        assert runs[str(point)]["start"] == point
        assert runs[str(point)]["records"] == continuous["records"][point:point + after], point


@pytest.fixture(scope="module")
def saved_at_tp2_pp2(launch_ranks, tmp_path_factory) -> dict:
    """The uninterrupted TP2 x PP2 run (distributed optimizer), saved after SAVE_AFTER steps in
    the format that resumes in any layout (the default, dp_reshardable, changes DP only)."""
    return _saved_reshardable(launch_ranks, tmp_path_factory, "tiny_tp2_pp2", 4, [])


@pytest.fixture(scope="module")
def saved_hybrid_at_tp2_sp(launch_ranks, tmp_path_factory) -> dict:
    """The hybrid at TP2 + SP: every Mamba weight but the norm and every expert split over TP."""
    return _saved_reshardable(launch_ranks, tmp_path_factory, "hybrid_tiny_tp2_sp", 2,
                              HYBRID_SIZE)


def _saved_reshardable(launch_ranks, tmp_path_factory, recipe, ranks, overrides) -> dict:
    root = tmp_path_factory.mktemp(recipe)
    checkpoints = root / "checkpoints"
    overrides = [*overrides, "optimizer.distributed=true",
                 "checkpoint.optimizer_format=fully_reshardable"]
    result = launch_ranks(ranks, f"{ENTRY}:continuous", {
        "recipe": recipe, "steps": STEPS, "run_dir": str(root), "overrides": overrides,
        "save_at": [SAVE_AFTER], "checkpoint_dir": str(checkpoints),
    })[0]
    return {"checkpoints": str(checkpoints), "records": result["records"],
            "overrides": overrides}


# (saved run, recipe to resume at, ranks, extra overrides)
RESHARD_CASES = [
    ("saved_at_tp2_pp2", "tiny_dp1", 1, []),
    ("saved_at_tp2_pp2", "tiny_pp2_vpp2", 2, []),
    ("saved_at_tp2_pp2", "tiny_dp2_distopt", 2, []),
    # Mamba's in_proj (z, x, B, C, dt, each split over TP) and the TP-split experts gathered,
    # the layers handed to four virtual stages (M* | -M | E | -: another pattern, same model).
    ("saved_hybrid_at_tp2_sp", "hybrid_tiny_pp2_vpp2", 2, []),
]


@pytest.mark.parametrize(("saved", "recipe", "ranks", "overrides"), RESHARD_CASES,
                         ids=["tp1_pp1", "pp2_vpp2", "dp2_distopt", "hybrid_tp2_sp_to_pp2_vpp2"])
def test_resume_at_another_layout_continues_the_run(
    launch_ranks, request, tmp_path, saved, recipe, ranks, overrides
):
    source, saved = saved, request.getfixturevalue(saved)
    before = saved["records"]
    after = launch_ranks(ranks, f"{ENTRY}:resumed", {
        "recipe": recipe, "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": [*saved["overrides"], *overrides,
                      f"checkpoint.load={saved['checkpoints']}"],
    })[0]
    assert after["start"] == SAVE_AFTER
    expected = before[SAVE_AFTER:]
    # Consumed samples and tokens continue from the checkpoint whatever the DP size.
    assert [(r["samples"], r["tokens"], r["lr"]) for r in after["records"]] == [
        (r["samples"], r["tokens"], r["lr"]) for r in expected]
    worst = max(abs(got["loss"] - want["loss"])
                for got, want in zip(after["records"], expected, strict=True))
    print(f"{source} -> {recipe}: max |loss - uninterrupted| = {worst:.2e}")
    for got, want in zip(after["records"], expected, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=RESHARD_TOLERANCE)
        # The router's expert bias moves in steps of its update rate: resharded, it is the same.
        assert got["expert_bias"] == want["expert_bias"]

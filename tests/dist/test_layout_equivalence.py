"""Every parallel layout trains the same model: per-step losses equal the single-rank run.

All layouts start from one reference checkpoint (pipeline parallelism changes the random
initial weights, so a shared seed is not enough) and see the same global batches. Losses are
the per-token mean over the whole global batch, reduced across ranks by the trainer. The
hybrid Mamba-Transformer model is checked the same way in its own layouts (TP2 + SP, PP2 with
and without '|', PP2 x VPP2, DP2 with the distributed optimizer, EP2, CP2, CP2 x TP2 + SP,
TP2 + SP x DP2 x EP2), and the tiny Super-shaped one (latent MoE, two shared MTP depths) in
TP2 + SP, PP2, PP2 x VPP2, EP2, DP2 with the distributed optimizer, TP2 + SP x PP2 x EP2 and
CP2, its MTP losses (each depth's per-token loss, logged apart) included.
"""

from __future__ import annotations

import pytest

from tests.dist.layout_runs import HYBRID_SIZE

pytestmark = pytest.mark.dist

STEPS = 5
ENTRY = "tests.dist.layout_runs"
# fp32 on CPU: layouts differ only in summation order (measured differences ~1e-6).
LOSS_TOLERANCE = 2e-5

# (recipe, ranks, extra overrides)
LAYOUTS = [
    ("tiny_dp2", 2, []),
    ("tiny_dp2_distopt", 2, []),
    ("tiny_tp2", 2, []),
    ("tiny_tp2_sp", 2, []),
    ("tiny_pp2", 2, []),
    ("tiny_pp2_vpp2", 2, []),
    ("tiny_tp2_pp2", 4, []),
    ("tiny_tp2_sp_dp2_distopt", 4, []),
    ("tiny_pp2_dp2_overlap", 4, []),
    # What the 64-GPU recipes use: overlapped grad reduce-scatter and param all-gather.
    ("tiny_dp2_distopt", 2, ["optimizer.overlap_grad_reduce=true",
                             "optimizer.overlap_param_gather=true"]),
    ("tiny_dp1_recompute", 1, []),
    # Selective recompute of the norms: Megatron's CheckpointWithoutOutput (the step fix
    # recompute_without_te_fp8_state, without Transformer Engine).
    ("tiny_dp1", 1, ["train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]"]),
    ("tiny_tp2_pp2", 4, ["train.recompute=full", "parallel.sequence_parallel=true"]),
    # Context parallel: Megatron's load-balanced chunks, the CPU runtime's reference attention.
    ("tiny_cp2", 2, []),
    ("tiny_cp4", 4, []),
    ("tiny_cp2_tp2_sp", 4, []),
    ("tiny_cp2_pp2_distopt", 4, []),
]


@pytest.fixture(scope="module")
def reference(launch_ranks, tmp_path_factory):
    """Reference weights (saved once, by the single-rank run before it trains) and the
    single-rank losses from them."""
    root = tmp_path_factory.mktemp("reference")
    result = launch_ranks(1, f"{ENTRY}:train_steps", {
        "recipe": "tiny_dp1", "steps": STEPS, "run_dir": str(root / "ref"),
        "weights_dir": str(root / "w"),
    })[0]
    return result["weights"], result


def _train(launch_ranks, recipe, ranks, overrides, weights, run_dir, steps=STEPS) -> dict:
    payload = {
        "recipe": recipe,
        "steps": steps,
        "run_dir": str(run_dir),
        "overrides": [f"checkpoint.load={weights}", "checkpoint.load_model_only=true", *overrides],
    }
    results = launch_ranks(ranks, f"{ENTRY}:train_steps", payload)
    # The trainer reduces the loss over all ranks, so every rank must report the same trace.
    assert all(r["losses"] == results[0]["losses"] for r in results)
    return results[0]


def test_reference_loss_falls(reference):
    _, result = reference
    losses = result["losses"]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"),
    LAYOUTS,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in LAYOUTS],
)
def test_layout_matches_single_rank(launch_ranks, reference, tmp_path, recipe, ranks, overrides):
    weights, expected = reference
    result = _train(launch_ranks, recipe, ranks, overrides, weights, tmp_path)
    worst = max(abs(a - b) for a, b in zip(result["losses"], expected["losses"], strict=True))
    print(f"{recipe} {overrides}: max |loss - reference| over {STEPS} steps = {worst:.2e}")
    assert result["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-3)


# The hybrid model (recipes/nemotron/nemotron_h.py: M*-ME-, Mamba2, attention, MLP and MoE routed
# the Nemotron 3 way): the Mamba mixer draws its conv, dt and A weights per TP rank
# (`ssm/mamba_mixer.py:318-380`), so here too every layout loads one reference, which the
# single-rank run saves before it trains.
HYBRID_REFERENCE = "hybrid_tiny_dp1"
HYBRID_STEPS = 3
HYBRID_LAYOUTS = [
    ("hybrid_tiny_tp2_sp", 2, []),
    ("hybrid_tiny_pp2", 2, []),  # an even split, 3 layers a stage
    ("hybrid_tiny_pp2_pipes", 2, []),  # M*-M | E-
    ("hybrid_tiny_pp2_vpp2", 2, []),  # M* | -M | E | -
    ("hybrid_tiny_dp2_distopt", 2, []),
    ("hybrid_tiny_dp1", 1, ["train.recompute=selective",
                            "train.recompute_modules=[layernorm,mlp,moe_act]"]),
    ("hybrid_tiny_ep2_dp2", 2, []),
    # Megatron's Mamba CP: all-to-all from sequence to head shards around the scan.
    ("hybrid_tiny_dp1", 2, ["parallel.context=2", "cluster.gpus_per_node=2"]),
    ("hybrid_tiny_tp2_sp", 4, ["parallel.context=2", "cluster.gpus_per_node=4"]),
    # Three at once, Nemotron 3 Nano's layout in miniature: TP2 + SP x DP2, experts over EP2.
    ("hybrid_tiny_tp2_sp", 4, ["parallel.expert=2", "cluster.gpus_per_node=4"]),
]


@pytest.fixture(scope="module")
def hybrid_reference(launch_ranks, tmp_path_factory):
    """The hybrid's single-rank trace, and the initial weights it saved for every layout."""
    root = tmp_path_factory.mktemp("hybrid-reference")
    result = launch_ranks(1, f"{ENTRY}:train_steps", {
        "recipe": HYBRID_REFERENCE, "steps": HYBRID_STEPS, "run_dir": str(root / "ref"),
        "weights_dir": str(root / "w"), "overrides": HYBRID_SIZE,
    })[0]
    return result["weights"], result


def test_hybrid_reference_loss_falls(hybrid_reference):
    losses = hybrid_reference[1]["losses"]
    assert len(losses) == HYBRID_STEPS
    assert losses[-1] < losses[0] - 0.05


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"),
    HYBRID_LAYOUTS,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in HYBRID_LAYOUTS],
)
def test_hybrid_layout_matches_single_rank(launch_ranks, hybrid_reference, tmp_path, recipe,
                                           ranks, overrides):
    weights, expected = hybrid_reference
    result = _train(launch_ranks, recipe, ranks, [*HYBRID_SIZE, *overrides], weights, tmp_path,
                    HYBRID_STEPS)
    worst = max(abs(a - b) for a, b in zip(result["losses"], expected["losses"], strict=True))
    print(f"{recipe} {overrides}: max |loss - reference| over {HYBRID_STEPS} steps = {worst:.2e}")
    assert result["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-3)


# The tiny Super-shaped hybrid (recipes/nemotron/nemotron3_super.py: MEM*EME/*E/*E): latent MoE,
# and two MTP depths sharing one attention + latent-MoE layer on the last stage; each layout's LM
# loss, grad norm and each MTP depth's loss (logged apart) equal one rank's from one reference.
SUPER_REFERENCE = "super_tiny_dp1"
SUPER_LAYOUTS = [
    ("super_tiny_tp2_sp", 2, []),
    ("super_tiny_pp2", 2, []),  # MEM* | EME, MTP on the last stage with its embedding copy
    ("super_tiny_pp2_vpp2", 2, []),  # ME | M* | EM | E, MTP on the last virtual stage
    ("super_tiny_ep2_dp2", 2, []),
    ("super_tiny_dp2_distopt", 2, []),
    ("super_tiny_tp2_sp_pp2_ep2", 4, []),  # three at once
    # MTP's shift of tokens across CP ranks' load-balanced chunks (`roll_tensor`). Megatron
    # weighs each CP rank's MTP loss by that rank's own token counts (the local sums of
    # `transformer/multi_token_prediction.py:175-236` in :883-893), not one rank's: measured
    # 5e-6 from one rank over 3 steps (2e-7 without MTP), inside the tolerance.
    ("super_tiny_dp1", 2, ["parallel.context=2", "cluster.gpus_per_node=2"]),
]


@pytest.fixture(scope="module")
def super_reference(launch_ranks, tmp_path_factory):
    """The tiny Super's single-rank trace, and the initial weights it saved for every layout."""
    root = tmp_path_factory.mktemp("super-reference")
    result = launch_ranks(1, f"{ENTRY}:train_steps", {
        "recipe": SUPER_REFERENCE, "steps": HYBRID_STEPS, "run_dir": str(root / "ref"),
        "weights_dir": str(root / "w"), "overrides": HYBRID_SIZE,
    })[0]
    return result["weights"], result


def test_super_reference_logs_each_mtp_depth_apart(super_reference):
    result = super_reference[1]
    assert all(set(step) == {"mtp_1_loss", "mtp_2_loss"} for step in result["mtp_losses"])
    # Not the LM loss: each depth predicts a token further ahead.
    assert all(step["mtp_1_loss"] != loss
               for step, loss in zip(result["mtp_losses"], result["losses"], strict=True))
    assert result["losses"][-1] < result["losses"][0] - 0.05


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"), SUPER_LAYOUTS,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in SUPER_LAYOUTS],
)
def test_super_layout_matches_single_rank(launch_ranks, super_reference, tmp_path, recipe, ranks,
                                          overrides):
    weights, expected = super_reference
    result = _train(launch_ranks, recipe, ranks, [*HYBRID_SIZE, *overrides], weights, tmp_path,
                    HYBRID_STEPS)
    worst = max(abs(a - b) for a, b in zip(result["losses"], expected["losses"], strict=True))
    mtp = max(abs(step[k] - ref[k]) for step, ref in zip(
        result["mtp_losses"], expected["mtp_losses"], strict=True) for k in ref)
    print(f"{recipe} {overrides}: max |loss - reference| = {worst:.2e}, max |MTP loss - "
          "reference| = "
          f"{mtp:.2e} over {HYBRID_STEPS} steps")
    assert result["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert mtp <= LOSS_TOLERANCE
    assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-3)


def test_gradient_accumulation_equals_large_microbatch(launch_ranks, reference, tmp_path):
    """4 micro-batches of 2 (the reference) == 1 micro-batch of 8 on one rank."""
    weights, expected = reference
    result = _train(launch_ranks, "tiny_dp1", 1, ["train.micro_batch_size=8"], weights, tmp_path)
    assert result["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)

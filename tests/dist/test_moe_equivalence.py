"""Expert parallelism trains the same MoE model: every EP layout's losses equal one rank's.

The tiny Mixtral-shaped model (recipes/mixtral.py: 4 layers, 4 SwiGLU experts, top-2, the
load-balancing loss on) is saved once; every layout loads those weights (expert parallelism
changes how the initial weights are drawn, so a shared seed is not enough) and sees the same
global batches. A layout that exchanges tokens wrongly changes the losses (a token reaching
the wrong expert changes its output), and a wrongly scaled load-balancing loss changes the
router's gradient and so the grad norm. The router figures the MoE plugin reports (load-balancing
loss, tokens per expert, imbalance) must be global, so they too must equal the single rank's.
"""

from __future__ import annotations

import pytest

from tests.dist.layout_runs import HYBRID_SIZE

pytestmark = pytest.mark.dist

STEPS = 5
ENTRY = "tests.dist.moe_runs"
REFERENCE = "mixtral_tiny_ep1"
EXPERTS, TOPK = 4, 2
TOKENS = 8 * 128  # global batch x sequence length of the tiny recipes
# fp32 on CPU; layouts differ only in summation order. Measured over 5 steps: losses at most
# 2.4e-7 apart (TP2+SP x EP2; the EP-only layouts are bit-identical), grad norms 2.3e-7
# relative, load-balancing losses 1.2e-7. About 10x that; breaking the token exchange or the
# load-balancing loss's scale moves losses by >1e-4 and grad norms by >1e-3.
LOSS_TOLERANCE = 2e-6
RELATIVE_TOLERANCE = 2e-6  # grad norms and load-balancing losses
# Per-layer tokens per expert: another summation order may break a near-tie of two router
# logits the other way (never seen here); each such token moves between two experts.
TOKEN_TOLERANCE = 2

# (recipe, ranks, extra overrides)
LAYOUTS = [
    ("mixtral_tiny_ep2_dp2", 2, []),
    ("mixtral_tiny_ep2_dp2", 2, ["model.moe_token_dispatcher=allgather"]),
    ("mixtral_tiny_ep4_dp4", 4, []),
    ("mixtral_tiny_tp2_sp_ep2_dp2", 4, []),
    ("mixtral_tiny_pp2_ep2_dp2", 4, []),
    # Full recompute runs each router twice per micro-batch; its tokens must count once.
    ("mixtral_tiny_ep2_dp2", 2, ["train.recompute=full"]),
    ("mixtral_tiny_ep2_dp2", 2, ["train.recompute=selective",
                                 "train.recompute_modules=[layernorm,moe]"]),
]


def _train(launch_ranks, recipe, ranks, overrides, weights, run_dir) -> dict:
    payload = {
        "recipe": recipe,
        "steps": STEPS,
        "run_dir": str(run_dir),
        "overrides": [f"checkpoint.load={weights}", "checkpoint.load_model_only=true", *overrides],
    }
    results = launch_ranks(ranks, f"{ENTRY}:train_steps_with_figures", payload)
    # Losses and figures are reduced over all ranks: every rank must report the same.
    assert all(r == results[0] for r in results)
    return results[0]


@pytest.fixture(scope="module")
def reference(launch_ranks, tmp_path_factory):
    """Reference weights (saved once, by the single-rank run before it trains) and the
    single-rank trace from them."""
    root = tmp_path_factory.mktemp("moe-reference")
    trace = launch_ranks(1, f"{ENTRY}:train_steps_with_figures", {
        "recipe": REFERENCE, "steps": STEPS, "run_dir": str(root / "ref"),
        "weights_dir": str(root / "w"), "overrides": [],
    })[0]
    return trace.pop("weights"), trace


def test_reference_trains_and_its_router_figures_add_up(reference):
    _, trace = reference
    assert trace["losses"][-1] < trace["losses"][0] - 0.1
    for extra, per_layer in zip(trace["extra"], trace["per_layer"], strict=True):
        assert len(per_layer) == 4  # every layer is an MoE layer
        for layer in per_layer:
            assert sum(layer) == TOKENS * TOPK  # each token reaches top-k experts, once
        imbalance = max(max(layer) / (sum(layer) / EXPERTS) for layer in per_layer)
        assert extra["moe_imbalance"] == pytest.approx(imbalance, rel=1e-12)
        experts = [extra[f"moe_tokens_e{e}"] for e in range(EXPERTS)]
        layer_means = [sum(tokens) / len(per_layer) for tokens in zip(*per_layer, strict=True)]
        assert experts == pytest.approx(layer_means, rel=1e-12)
        assert sum(experts) == pytest.approx(TOKENS * TOPK, rel=1e-12)
        # Switch loss E x sum_e(f_e x P_e), without its coefficient: 1 when perfectly balanced.
        assert 0.9 < extra["moe_load_balancing_loss"] < 1.5


@pytest.mark.parametrize(
    ("recipe", "ranks", "overrides"),
    LAYOUTS,
    ids=[f"{r}{'+' + '+'.join(o) if o else ''}" for r, _, o in LAYOUTS],
)
def test_expert_layout_matches_single_rank(
    launch_ranks, reference, tmp_path, recipe, ranks, overrides
):
    weights, expected = reference
    trace = _train(launch_ranks, recipe, ranks, overrides, weights, tmp_path)
    pairs = {key: list(zip(trace[key], expected[key], strict=True))
             for key in ("losses", "grad_norms", "extra")}
    name = "moe_load_balancing_loss"
    print(f"{recipe} {overrides}: over {STEPS} steps max |loss - reference| "
          f"{max(abs(a - b) for a, b in pairs['losses']):.2e}, grad norm relative "
          f"{max(abs(a / b - 1) for a, b in pairs['grad_norms']):.2e}, load-balancing loss "
          f"{max(abs(a[name] - b[name]) for a, b in pairs['extra']):.2e}")
    assert trace["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert trace["grad_norms"] == pytest.approx(expected["grad_norms"], rel=RELATIVE_TOLERANCE)
    _assert_same_router_figures(trace, expected)


def _assert_same_router_figures(trace: dict, expected: dict) -> None:
    """The figures are global: the same tokens reach the same experts as on one rank, and the
    load-balancing loss is Megatron's, reduced over all ranks."""
    for got, want in zip(trace["per_layer"], expected["per_layer"], strict=True):
        assert len(got) == len(want)
        for got_layer, want_layer in zip(got, want, strict=True):
            assert got_layer == pytest.approx(want_layer, abs=TOKEN_TOLERANCE)
    name = "moe_load_balancing_loss"
    for got, want in zip(trace["extra"], expected["extra"], strict=True):
        assert got.keys() == want.keys()
        assert got[name] == pytest.approx(want[name], rel=RELATIVE_TOLERANCE)


def test_router_figures_reach_metrics_jsonl_and_the_log(launch_ranks, tmp_path):
    """A whole run, as scripts/pretrain.py runs it: every train record and step log line
    carries the figures."""
    run = launch_ranks(1, f"{ENTRY}:pretrain_metrics", {
        "recipe": REFERENCE, "run_dir": str(tmp_path),
        "overrides": ["train.train_iters=2", "scheduler.warmup_iters=1", "logging.log_interval=1"],
    })[0]
    assert [r["step"] for r in run["records"]] == [1, 2]
    for record, line in zip(run["records"], run["log"], strict=True):
        extra = record["extra"]
        assert extra["moe_load_balancing_loss"] > 0
        assert sum(extra[f"moe_tokens_e{e}"] for e in range(EXPERTS)) == TOKENS * TOPK
        assert f"| moe_imbalance {extra['moe_imbalance']:.4g}" in line


def test_hybrid_router_figures_follow_the_routing_used(launch_ranks, tmp_path):
    """Nemotron 3's routing in the hybrid (M*-ME-: one MoE layer of six; sigmoid scores, expert
    bias, seq_aux_loss): the balance loss is the mean over its MoE layers, as for Mixtral (over
    all six layers it would read 1/6 of it), and the tokens per expert are those of the routing
    actually used: with expert 0's bias at +10 (sigmoid scores lie in (0, 1)) every token takes
    it as one of its two experts, where the scores alone would give it about a quarter."""
    tokens = 4 * 64  # HYBRID_SIZE: global batch x sequence length
    trace = launch_ranks(1, f"{ENTRY}:train_steps_with_figures", {
        "recipe": "hybrid_tiny_dp1", "steps": 2, "run_dir": str(tmp_path),
        "overrides": HYBRID_SIZE, "expert_bias": [10.0, 0.0, 0.0, 0.0],
    })[0]
    for extra, per_layer in zip(trace["extra"], trace["per_layer"], strict=True):
        assert len(per_layer) == 1 and sum(per_layer[0]) == tokens * TOPK
        assert extra["moe_tokens_e0"] == tokens
        assert extra["moe_imbalance"] == pytest.approx(tokens / (tokens * TOPK / EXPERTS))
        # Megatron's seq_aux_loss scores the unbiased routing: about 1 when balanced.
        assert 0.9 < extra["moe_seq_load_balancing_loss"] < 1.5

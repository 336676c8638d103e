"""Packing is exact: one packed row of several documents trains like each document alone.

The summed loss and the gradients of one row holding documents of 7, 12 and 9 tokens plus 4
padding tokens equal those of the three documents each run alone (three micro-batches of one
step, same loss tokens, so `finalize_model_grads` divides both by 25), at TP1, TP2 with sequence
parallelism and PP3 (a middle stage must get the boundaries too), all from one saved reference
checkpoint (the TP1 run saves it), and at CP2 with each document padded to a multiple of
2 x CP. The hybrid Mamba-Transformer model (M*-E) likewise, at TP1, and the tiny Super with
two MTP depths (the row against its documents as rows of one micro-batch). Controls show
the comparison can fail: the packed row under causal-only attention (no document mask; for the
hybrid also no `seq_idx` for Mamba), and at PP3 with the boundaries withheld from the middle
stage.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.packed_runs"
RECIPE = "tiny_dp1"
LOSS_TOKENS = 6 + 11 + 8  # each document of n tokens gives n - 1
# fp32 on CPU: the two runs differ only in summation order (measured: loss 1.1e-7 relative,
# grads 9e-8 absolute on grads up to 0.55, at every layout).
LOSS_REL_TOLERANCE = 1e-6
GRAD_ABS_TOLERANCE = 1e-5
# A wrong mask must move the loss and the gradients 100 times further than the tolerance (on
# this untrained model the controls move the loss by about 1e-3 relative, the grads by ~0.1).
CONTROL_MIN_REL = 100 * LOSS_REL_TOLERANCE

# (id, ranks, overrides)
LAYOUTS = [
    ("tp1", 1, []),
    ("tp2_sp", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true",
                   "cluster.gpus_per_node=2"]),
    ("pp3", 3, ["parallel.pipeline=3", "cluster.gpus_per_node=3"]),
    # Documents padded to multiples of 2 x CP = 4 (7, 12, 9 -> 8, 12, 12: the whole row), split
    # per document by Megatron, `cu_seqlens_q_padded` set, RoPE positions per padded document.
    ("cp2", 2, ["parallel.context=2", "cluster.gpus_per_node=2"]),
]
PAD_MULTIPLE = {"cp2": 4}
# The hybrid through the whole model (Mamba2 conv and scan split by document, attention masked
# per document, MLP, MoE) from its own saved weights. Megatron's seq_aux_loss balances each
# row (`transformer/moe/router.py:444-490`), so a packed row is not its documents alone for it:
# off here. Packed rows with Mamba CP need Transformer Engine (`ssm/mamba_context_parallel.py:
# 377-380`).
HYBRID = ["model.num_layers=4", "model.hybrid_layer_pattern=M*-E", "model.moe_aux_loss_coeff=0"]
HYBRID_LAYOUTS = [("hybrid_tp1", 1, HYBRID)]


def _launch(launch_ranks, layout: str, run_dir, overrides: list[str], **extra) -> list[dict]:
    _, ranks, layout_overrides = next(
        entry for entry in [*LAYOUTS, *HYBRID_LAYOUTS] if entry[0] == layout)
    return launch_ranks(ranks, f"{ENTRY}:packed_vs_alone", {
        "recipe": "hybrid_tiny_dp1" if layout.startswith("hybrid") else RECIPE,
        "run_dir": str(run_dir),
        "overrides": [*overrides, *layout_overrides],
        "middle_stage_control": layout == "pp3",
        "row_max_seqlen_probe": layout == "tp1",
        "pad_multiple": PAD_MULTIPLE.get(layout, 1),
        **extra,
    })


@pytest.fixture(scope="module")
def runs(launch_ranks, tmp_path_factory):
    """run(layout id) -> the per-rank results, each layout launched once per module. The TP1
    run saves its initial weights first; every other layout loads them."""
    root = tmp_path_factory.mktemp("packed")
    cache: dict[str, list[dict]] = {}
    weights: dict[str, str] = {}

    def run(layout: str) -> list[dict]:
        model = "hybrid" if layout.startswith("hybrid") else "gpt"
        reference = {"gpt": "tp1", "hybrid": "hybrid_tp1"}[model]
        if model not in weights:  # the model's one-rank run saves what its layouts load
            cache[reference] = _launch(launch_ranks, reference, root / reference, [],
                                       weights_dir=str(root / f"w-{model}"))
            weights[model] = cache[reference][0]["weights"]
        if layout not in cache:
            load = [f"checkpoint.load={weights[model]}", "checkpoint.load_model_only=true"]
            cache[layout] = _launch(launch_ranks, layout, root / layout, load)
        return cache[layout]

    return run


def _loss(results: list[dict], key: str) -> list:
    """[summed loss, loss tokens] from the last stage (every rank reports it there)."""
    losses = [r[key] for r in results if r[key] is not None]
    assert losses and all(loss == losses[0] for loss in losses)
    return losses[0]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("layout", [entry[0] for entry in [*LAYOUTS, *HYBRID_LAYOUTS]])
def test_packed_row_equals_documents_alone(runs, layout):
    results = runs(layout)
    (alone, alone_tokens), (packed, tokens) = _loss(results, "alone"), _loss(results, "packed")
    grad_diff = max(r["grad_max_diff"] for r in results)
    grad_max = max(r["grad_max"] for r in results)
    print(f"{layout}: loss {packed:.6f} vs {alone:.6f} (rel {_rel(packed, alone):.1e}), "
          f"max |grad diff| {grad_diff:.1e} (max |grad| {grad_max:.1e})")
    assert tokens == alone_tokens == LOSS_TOKENS
    assert _rel(packed, alone) <= LOSS_REL_TOLERANCE
    assert grad_max > 1e-3  # the gradients compared are not all (near) zero
    assert grad_diff <= GRAD_ABS_TOLERANCE


@pytest.mark.parametrize("layout", ["tp1", "hybrid_tp1"])
def test_causal_only_attention_is_detected(runs, layout):
    """Without the document boundaries tokens attend to earlier documents (and, in the hybrid,
    the Mamba conv and scan carry state across them): the same comparison fails."""
    results = runs(layout)
    alone, causal = _loss(results, "alone")[0], _loss(results, "causal_only")[0]
    grad_diff = max(r["causal_only_grad_max_diff"] for r in results)
    print(f"causal-only control: loss rel diff {_rel(causal, alone):.1e}, "
          f"max |grad diff| {grad_diff:.1e}")
    # The untrained hybrid's loss moves less (measured 2.5e-5 relative), its grads as much.
    assert _rel(causal, alone) > (CONTROL_MIN_REL if layout == "tp1" else 10 * LOSS_REL_TOLERANCE)
    assert grad_diff > 100 * GRAD_ABS_TOLERANCE
    if layout != "tp1":
        return
    # Not a control: RoPE with positions running across documents (max_seqlen = row length)
    # gives the same scores under a per-document mask, since RoPE depends on differences only.
    probe = _loss(results, "row_max_seqlen")[0]
    print(f"max_seqlen = row length (no assertion): loss rel diff {_rel(probe, alone):.1e}, "
          f"max |grad diff| {max(r['row_max_seqlen_grad_max_diff'] for r in results):.1e}")


def test_boundaries_withheld_from_the_middle_stage_are_detected(runs):
    results = runs("pp3")
    alone, ends_only = _loss(results, "alone")[0], _loss(results, "ends_only")[0]
    grad_diff = max(r["ends_only_grad_max_diff"] for r in results)
    print(f"middle-stage control: loss rel diff {_rel(ends_only, alone):.1e}, "
          f"max |grad diff| {grad_diff:.1e}")
    assert _rel(ends_only, alone) > CONTROL_MIN_REL
    assert grad_diff > 100 * GRAD_ABS_TOLERANCE


def test_packed_loss_is_the_same_in_every_layout(runs):
    """All layouts start from one checkpoint, so the packed row's loss agrees across them too."""
    losses = {layout: _loss(runs(layout), "packed")[0] for layout, _, _ in LAYOUTS}
    worst = max(_rel(loss, losses["tp1"]) for loss in losses.values())
    print(f"packed loss per layout: {losses} (max rel diff {worst:.1e})")
    assert worst <= 1e-5


# The tiny Super (latent MoE, two MTP depths sharing a layer): Megatron's MTP shifts a packed
# row's tokens per document (`_roll_tensor_packed_seq`, `transformer/multi_token_prediction.py:
# 238-282`), so each depth predicts within its document. Megatron weighs a micro-batch's MTP
# loss by that micro-batch's token counts, so the documents are compared as rows of one
# micro-batch (not three). Per-row load balancing off, as for the hybrid above.
SUPER = ["model.hybrid_layer_pattern=M*E/*E/*E", "model.num_layers=3",
         "model.moe_aux_loss_coeff=0"]


@pytest.fixture(scope="module")
def mtp_run(launch_ranks, tmp_path_factory):
    root = tmp_path_factory.mktemp("packed-mtp")
    return launch_ranks(1, f"{ENTRY}:mtp_packed_vs_rows", {
        "recipe": "super_tiny_dp1", "run_dir": str(root), "overrides": SUPER})[0]


def test_packed_row_with_mtp_equals_its_documents(mtp_run):
    (alone, alone_tokens), (packed, tokens) = mtp_run["alone"], mtp_run["packed"]
    mtp = max(_rel(p, a) for p, a in zip(mtp_run["packed_mtp"], mtp_run["alone_mtp"],
                                         strict=True))
    print(f"MTP packed: loss rel {_rel(packed, alone):.1e}, MTP losses {mtp_run['packed_mtp']} "
          f"vs {mtp_run['alone_mtp']} (rel {mtp:.1e}), max |grad diff| "
          f"{mtp_run['grad_max_diff']:.1e}")
    assert tokens == alone_tokens == LOSS_TOKENS
    assert len(mtp_run["alone_mtp"]) == 2 and mtp <= LOSS_REL_TOLERANCE
    assert _rel(packed, alone) <= LOSS_REL_TOLERANCE
    assert mtp_run["mtp_parameters"] > 0 and mtp_run["mtp_grad_max"] > 1e-3
    assert mtp_run["grad_max_diff"] <= GRAD_ABS_TOLERANCE


def test_packed_row_with_mtp_without_boundaries_is_detected(mtp_run):
    causal = max(_rel(c, a) for c, a in zip(mtp_run["causal_only_mtp"], mtp_run["alone_mtp"],
                                            strict=True))
    print(f"MTP causal-only control: MTP loss rel diff {causal:.1e}, max |grad diff| "
          f"{mtp_run['causal_only_grad_max_diff']:.1e}")
    assert causal > 10 * LOSS_REL_TOLERANCE
    assert mtp_run["causal_only_grad_max_diff"] > 100 * GRAD_ABS_TOLERANCE

"""The last stage's output layer and loss in the planner: at the main head's loss its BF16 logits
are held beside the FP32 copy the loss casts (once, not per MTP depth, and not at all in FP32
runs), and the plan line says how much of 'logits and loss' they are; each head's output layer
and vocabulary-parallel loss send their TP collectives once per micro-batch, on the last stage
only, whatever the recompute."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.models.hybrid import pattern as hybrid
from recipes.plan.activations import output_bytes, stage_activations
from recipes.plan.build import PlanOptions, make_plan, stage_plans
from recipes.plan.cluster import apply_cluster, load_cluster
from recipes.plan.comm import OUTPUT_LAYERS
from recipes.plan.fit import contributor_text, size_text
from recipes.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
CPU = "conf/cluster/cpu_local.yaml"
H100 = "conf/cluster/h100_80gb_8x8.yaml"
BF16 = "precision.dtype=bf16"


def _config(recipe: str, *overrides: str):
    return resolve_config([f"recipe={recipe}", *overrides])


def _logits(cfg, element_bytes: int) -> float:
    """One head's logits for one micro-batch on one rank: tokens x padded vocabulary / TP."""
    layout = cfg.layout
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length / layout.context
    return tokens * layout.padded_vocab / layout.tensor * element_bytes


@pytest.mark.parametrize("recipe", ["tiny_tp2_pp2", "super_tiny_pp2"])
def test_the_last_stage_holds_the_main_heads_bf16_logits_beside_their_fp32_copy(recipe):
    """2 bytes a logit more on the last stage, once: MTP depths' FP32 logits stay in their own
    term, their BF16 ones are freed before the main head's are made."""
    cfg = _config(recipe, BF16)
    first, last = stage_activations(cfg, "flash", te_layers=True)
    assert first.output == 0.0
    assert last.output == pytest.approx(output_bytes(cfg) + _logits(cfg, 2))
    if cfg.model.is_hybrid:  # two MTP depths: the same one BF16 copy as without them
        without_mtp = _config(recipe, BF16, "model.hybrid_layer_pattern=MEM*|EME",
                              "model.mtp_loss_scaling_factor=0.1",
                              "model.mtp_use_repeated_layer=false")
        assert stage_activations(without_mtp, "flash", te_layers=True)[1].output == last.output


def test_an_fp32_run_casts_no_copy():
    cfg = _config("tiny_tp2_pp2")
    assert cfg.precision.dtype == "fp32"
    assert stage_activations(cfg, "flash", te_layers=True)[1].output == output_bytes(cfg)


SUPER_1M = ["recipe=nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16", "phases=[]",
            "data.blend=conf/data/nemotron3_super_long_context.yaml",
            "train.global_batch_size=16", "model.seq_length=1048576",
            "data.documents=concatenate", "train.micro_batch_size=1", "parallel.context=16"]


def test_the_plan_line_names_the_bf16_logits_and_the_planner_page_quotes_them():
    """Super's 1M-token stage at TP4 x CP16: 2^20 / 16 tokens x 131,072 / 4 x 2 bytes."""
    cluster = load_cluster(str(REPO / H100))
    cfg = apply_cluster(resolve_config(SUPER_1M), cluster)
    plan = make_plan(cfg, cluster, PlanOptions(listed_groups=0))
    cast = 2**20 / 16 * cfg.layout.padded_vocab / 4 * 2
    size = dict(plan.worst.contributors())["logits and loss"]
    assert contributor_text(plan, "logits and loss", size).endswith(
        f"({size_text(cast)} of it the BF16 logits beside their FP32 copy)")
    page = " ".join((REPO / "docs" / "planner.md").read_text(encoding="utf-8").split())
    assert f"the main head's BF16 logits, {cast / 1e9:.2f} of {size / 1e9:.2f} GB" in page


def _rows(recipe: str, cluster: str, *overrides: str) -> list[tuple[float, float]]:
    """(bytes, collectives) of each stage's output-layer row (none: (0, 0))."""
    stages = stage_plans(_config(recipe, *overrides), load_cluster(str(REPO / cluster)),
                         PlanOptions(listed_groups=0))
    rows = [[t for t in s.traffic if t.operation == OUTPUT_LAYERS] for s in stages]
    assert all(t.group == "tp" for r in rows for t in r)
    return [(sum(t.bytes_sent for t in r), sum(t.collectives for t in r)) for r in rows]


def test_without_sp_each_head_all_reduces_its_input_gradient_and_the_losss_three_values():
    """tiny_tp2_pp2: TP2, no SP, FP32, 4 micro-batches, one head; on CPU ranks the unfused loss
    all-reduces max, target logit and sum apart (3), the backward the input's gradient (1)."""
    cfg = _config("tiny_tp2_pp2")
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length
    ring, micro = 1 / 2, cfg.layout.microbatches
    expected = micro * (2 * ring * tokens * cfg.model.hidden_size * 4 + 2 * ring * 3 * tokens * 4)
    first, last = _rows("tiny_tp2_pp2", CPU)
    assert first == (0.0, 0.0)
    assert last == (pytest.approx(expected), micro * (1 + 3))


def test_with_sp_each_head_gathers_twice_and_reduce_scatters_and_mtp_depths_count_too():
    """super_tiny_tp2_sp: TP2 + SP, 2 MTP depths, so 3 heads; each gathers its input forward and
    again backward and reduce-scatters its gradient (3), its loss all-reduces (3 on CPU ranks);
    each depth also gathers its per-token maximum and index (2, FP32 + int64)."""
    cfg = _config("super_tiny_tp2_sp")
    depths = hybrid.mtp_depths(cfg.model.hybrid_layer_pattern)
    assert depths == 2
    tokens = cfg.train.micro_batch_size * cfg.model.seq_length
    ring, micro, heads = 1 / 2, cfg.layout.microbatches, 1 + depths
    per_head = 3 * ring * tokens * cfg.model.hidden_size * 4 + 2 * ring * 3 * tokens * 4
    argmax = 1 * tokens * (4 + 8)
    [row] = _rows("super_tiny_tp2_sp", CPU)
    assert row == (pytest.approx(micro * (heads * per_head + depths * argmax)),
                   micro * (heads * (3 + 3) + depths * 2))
    assert _rows("super_tiny_tp2_sp", CPU, "train.recompute=full") == [row]


def test_the_fused_loss_on_gpu_ranks_batches_two_of_its_all_reduces():
    """On a GPU cluster the run builds TE's layers and Megatron's fused cross entropy, which
    all-reduces the target logit and the sum in one: a collective fewer per head, same bytes."""
    cfg = _config("super_tiny_tp2_sp")
    heads = 1 + hybrid.mtp_depths(cfg.model.hybrid_layer_pattern)
    [(cpu_sent, cpu_started)] = _rows("super_tiny_tp2_sp", CPU)
    [(gpu_sent, gpu_started)] = _rows("super_tiny_tp2_sp", H100)
    assert gpu_sent == pytest.approx(cpu_sent)
    assert cpu_started - gpu_started == heads * cfg.layout.microbatches

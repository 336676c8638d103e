"""The parity check's pure pieces: Megatron-LM's command line for it and the sample map that
gives each DP rank its own micro-batches (end to end: tests/dist/test_megatron_parity.py)."""

from __future__ import annotations

import torch

from recipes.resolve import resolve_config
from trainer.tools.megatron_parity import ALIGNMENTS, RecordedSamples, parity_arguments
from trainer.tools.parity_scope import unsupported


def test_arguments_carry_every_alignment_and_the_steps():
    """Each alignment is on Megatron-LM's command line: the flags the check adds, and the ones
    the recipe's own command line carries (per-token loss, the EOD loss mask)."""
    args = parity_arguments(resolve_config(["recipe=tiny_dp1"]), 5)
    for alignment in ALIGNMENTS:
        assert all(flag in args for flag in alignment.flags)
    assert {"--calculate-per-token-loss", "--eod-mask-loss"} <= set(args)
    assert args[args.index("--exit-interval") + 1] == "5"
    assert args[args.index("--train-iters") + 1] == "300"  # the recipe's schedule stands


def test_wsd_gets_its_resolved_decay_iterations():
    cfg = resolve_config(["recipe=tiny_dp1", "scheduler.style=wsd"])
    args = parity_arguments(cfg, 2)
    assert args[args.index("--lr-wsd-decay-iters") + 1] == "30"


def test_megatron_lm_indices_reach_this_ranks_own_micro_batches():
    # global batch 8, micro 2, DP 2: Megatron-LM gives rank 1 indices 2,3 then 6,7 of step 0
    batches = [[{k: torch.tensor([[10 * s + m * 2 + r] for r in range(2)]) for k in
                 ("tokens", "labels", "loss_mask", "position_ids")} for m in range(2)]
               for s in range(2)]
    rank1 = RecordedSamples(batches, global_batch=8, micro_batch=2, dp=2, dp_rank=1)
    assert [int(rank1[i]["tokens"][0]) for i in (2, 3, 6, 7, 10)] == [0, 1, 2, 3, 10]


def test_what_the_check_cannot_compare_is_one_line():
    ramp = unsupported(resolve_config(["recipe=tiny_dp1", "train.global_batch_size=16",
                                       "train.rampup_batch_size=[4,4,24]"]))
    assert ramp and "\n" not in ramp and "one batch size" in ramp
    assert unsupported(resolve_config(["recipe=tiny_dp1"])) is None
    assert unsupported(resolve_config(["recipe=hybrid_tiny_dp1"])) is None  # hybrids compare


def test_a_hybrid_is_compared_with_its_layer_pattern():
    args = parity_arguments(resolve_config(["recipe=hybrid_tiny_dp1"]), 3)
    assert args[args.index("--hybrid-layer-pattern") + 1] == "M*-ME-"


def test_a_refusal_comes_before_any_rank_starts(tmp_path):
    """The command's own check refuses in the launching process: no run directory is made."""
    from trainer.entry.commands import CHECK_MEGATRON_PARITY
    from trainer.entry.contract import main

    code = main(CHECK_MEGATRON_PARITY, ["recipe=tiny_dp1", "train.global_batch_size=16",
                                        "train.rampup_batch_size=[4,4,24]",
                                        f"output_dir={tmp_path}"])
    assert code == 2 and not any(tmp_path.iterdir())

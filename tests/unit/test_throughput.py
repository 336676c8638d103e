"""The throughput definitions on hand-made cases and the worked scaling example, exactly."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
from megatron.core import parallel_state

from plugins.protocol.packed_batch import packed_row
from recipes.plan.flops import model_flops_utilisation
from trainer.metrics import local_loss_sums
from trainer.step import masked_token_loss
from trainer.throughput import (
    PROFILE_STEPS,
    WARMUP_STEPS,
    counts_trained_rows,
    exposed_time,
    gpu_hours_for_tokens,
    hours_for_tokens,
    is_measured,
    measured_throughput,
    profiled_steps,
    scaling_efficiency,
    tokens_per_second,
    trained_sequences,
)

ROW = [1, 1, 1, 1, 0, 0]  # 4 loss tokens, then 2 padding positions
# What one rank computed in a step: its coordinates and its micro-batches' 0/1 loss masks.
RankTokens = namedtuple("RankTokens", "tp_rank last_pipeline_stage loss_masks")
LOSS = 2.0  # every loss token's loss; masked positions carry a loss that must not count
MASKED_LOSS = 1000.0


def world_loss_sums(monkeypatch, ranks) -> tuple[float, int]:
    """(loss sum, loss tokens) of the world as the trainer counts them: each fake rank's
    micro-batch reports come from `trainer.step.masked_token_loss`, the rank's part from
    `trainer.metrics.local_loss_sums` under that rank's TP rank and pipeline stage, and the
    parts add up over the ranks (the all-reduce of `sum_over_world`)."""
    total = torch.zeros(2, dtype=torch.float64)
    for rank in ranks:
        monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_rank",
                            lambda rank=rank: rank.tp_rank)
        monkeypatch.setattr(parallel_state, "is_pipeline_last_stage",
                            lambda *_, rank=rank, **__: rank.last_pipeline_stage)
        reports = []
        for mask in rank.loss_masks:
            loss_mask = torch.tensor([mask])
            per_token_loss = torch.where(loss_mask.bool(), LOSS, MASKED_LOSS)
            reports.append(masked_token_loss(loss_mask, per_token_loss)[2])
        total += local_loss_sums(reports).cpu()
    loss_sum, tokens = total.tolist()
    assert tokens == int(tokens)
    return loss_sum, int(tokens)


def effective_loss_tokens(monkeypatch, ranks) -> int:
    loss_sum, tokens = world_loss_sums(monkeypatch, ranks)
    assert loss_sum == LOSS * tokens  # only loss tokens' losses, each once
    return tokens


def test_padding_and_masked_positions_are_not_counted(monkeypatch):
    rank = RankTokens(tp_rank=0, last_pipeline_stage=True, loss_masks=[ROW, [0, 1, 1, 0]])
    assert world_loss_sums(monkeypatch, [rank]) == (6 * LOSS, 6)


def test_each_dp_replica_adds_its_own_tokens_once(monkeypatch):
    replicas = [RankTokens(0, True, [ROW]), RankTokens(0, True, [[1, 1, 1]])]
    assert effective_loss_tokens(monkeypatch, replicas) == 7


def test_tp_and_pp_copies_of_the_same_tokens_are_not_counted_again(monkeypatch):
    # TP2 x PP2 on one replica: four ranks see the same 4 loss tokens; only one reports them.
    copies = [RankTokens(tp, last, [ROW]) for tp in (0, 1) for last in (False, True)]
    assert effective_loss_tokens(monkeypatch, copies) == 4
    assert [effective_loss_tokens(monkeypatch, [copy]) for copy in copies] == [0, 4, 0, 0]


def test_cp_chunks_add_up_to_the_original_sequence(monkeypatch):
    sequence = [1, 1, 1, 0, 1, 1, 1, 1]  # 7 loss tokens, one masked
    chunks = [sequence[:2] + sequence[6:], sequence[2:6]]  # Megatron's CP2 chunk pairs
    ranks = [RankTokens(0, True, [chunk]) for chunk in chunks]
    tp_copies = [RankTokens(1, True, [chunk]) for chunk in chunks]
    assert effective_loss_tokens(monkeypatch, ranks + tp_copies) == 7


def test_worked_example_8_to_16_gpus():
    assert scaling_efficiency(17_000, 16, 10_000, 8) == pytest.approx(0.85, abs=1e-15)
    assert round(hours_for_tokens(1e9, 10_000), 1) == 27.8
    assert round(hours_for_tokens(1e9, 17_000), 1) == 16.3
    assert round(gpu_hours_for_tokens(1e9, 10_000, 8), 1) == 222.2
    assert round(gpu_hours_for_tokens(1e9, 17_000, 16), 1) == 261.4


def test_efficiency_is_one_for_linear_scaling_and_relative_to_the_base_size():
    assert scaling_efficiency(4_000, 4, 1_000, 1) == 1.0
    assert scaling_efficiency(3_000, 4, 1_500, 2) == 1.0
    assert scaling_efficiency(3_000, 4, 1_000, 1) == 0.75


def test_throughput_is_tokens_over_whole_step_time_not_a_mean_of_rates():
    steps = [(1.0, 100), (3.0, 100)]
    assert tokens_per_second(steps) == 50.0  # mean of rates would say 66.7


def test_warm_up_and_profiled_steps_leave_the_throughput():
    steps = [(10.0, 100)] + [(1.0, 100)] * (PROFILE_STEPS + 4)
    for index in profiled_steps(len(steps), exposed_comm=True):
        steps[index] = (5.0, 100)
    assert measured_throughput(steps, exposed_comm=True) == 100.0
    assert not is_measured(0, len(steps), exposed_comm=True) and WARMUP_STEPS == 1
    assert list(profiled_steps(len(steps), exposed_comm=True)) == list(
        range(1, 1 + PROFILE_STEPS))


def test_without_exposed_comm_only_the_warm_up_leaves_the_throughput():
    steps = [(10.0, 100)] + [(1.0, 100)] * (PROFILE_STEPS + 4)
    assert len(profiled_steps(len(steps), exposed_comm=False)) == 0
    assert [is_measured(i, len(steps), exposed_comm=False) for i in range(3)] == [
        False, True, True]
    steps[1] = (5.0, 100)  # counted now: nothing profiles it
    assert measured_throughput(steps, exposed_comm=False) < 100.0


def test_short_runs_are_not_profiled_and_count_every_step_when_too_short():
    assert len(profiled_steps(WARMUP_STEPS + 2 * PROFILE_STEPS - 1, exposed_comm=True)) == 0
    assert measured_throughput([(2.0, 100)], exposed_comm=True) == 50.0


def test_mfu_is_unknown_without_a_peak():
    assert model_flops_utilisation(50.0, None) is None
    assert model_flops_utilisation(50.0, 200.0) == 0.25


def test_exposed_communication_excludes_what_compute_hides():
    comm = [(0.0, 4.0), (3.0, 6.0), (10.0, 11.0)]  # union: [0, 6] and [10, 11] = 7 s
    compute = [(1.0, 2.0), (5.0, 12.0)]  # hides 1 s, 1 s and 1 s
    assert exposed_time(comm, compute) == 4.0
    assert exposed_time(comm, []) == 7.0


def _documents(*lengths: int) -> list[np.ndarray]:
    return [np.arange(1, n + 1) for n in lengths]


def test_a_full_row_is_one_sequence_of_its_length():
    rows = {"tokens": np.zeros((2, 16), dtype=np.int64)}  # a micro-batch of two rows of 16
    assert trained_sequences([rows, rows]) == (4 * 16, 4 * 16 * 16)


def test_a_packed_row_is_its_documents_without_the_padding():
    row = packed_row(_documents(7, 12, 9), 32, pad_id=0)  # + a padding segment of 4
    assert row["cu_seqlens"].tolist() == [0, 7, 19, 28, 32]
    assert trained_sequences([row]) == (28, 7 * 7 + 12 * 12 + 9 * 9)
    full = packed_row(_documents(20, 12), 32, pad_id=0)  # no padding segment
    assert trained_sequences([row, full]) == (28 + 32, 274 + 20 * 20 + 12 * 12)


def test_documents_padded_for_context_parallel_count_their_own_tokens():
    row = packed_row(_documents(7, 12, 9), 32, pad_id=0, pad_multiple=4)  # 8 + 12 + 12
    assert row["cu_seqlens_padded"].tolist() == [0, 8, 20, 32]
    assert trained_sequences([row]) == (28, 7 * 7 + 12 * 12 + 9 * 9)


def test_inter_document_rows_without_a_count_are_documents_end_to_end():
    """Megatron's GPTDataset rows have no padding segment (it folds a short sample's padding
    into the last document), so every segment of `cu_seqlens` is a document."""
    row = {"tokens": np.zeros((1, 32), dtype=np.int64),
           "cu_seqlens": np.array([0, 5, 30, 32], dtype=np.int32)}
    assert trained_sequences([row]) == (32, 25 + 625 + 4)


def test_one_rank_per_dp_replica_reports_the_rows_it_trained():
    """Every rank of a replica takes the same rows (CP splits them later): only TP rank 0 of
    the last pipeline stage at CP rank 0 adds them."""
    assert counts_trained_rows(tp_rank=0, cp_rank=0, last_pipeline_stage=True)
    assert not counts_trained_rows(tp_rank=1, cp_rank=0, last_pipeline_stage=True)
    assert not counts_trained_rows(tp_rank=0, cp_rank=1, last_pipeline_stage=True)
    assert not counts_trained_rows(tp_rank=0, cp_rank=0, last_pipeline_stage=False)

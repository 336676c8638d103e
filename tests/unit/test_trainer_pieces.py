"""Trainer pieces that need no process group: loss, data slicing, scheduler, translation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plugins.protocol.errors import RankUserError
from recipes.registry import get_recipe
from trainer.data import GlobalBatches, TokenTable, batch_outside_vocabulary, in_memory_sources
from trainer.step import masked_token_loss


def test_masked_token_loss_sums_only_loss_tokens():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    loss_sum, tokens, report = masked_token_loss(mask, per_token)
    assert loss_sum.item() == 10.0
    assert tokens.item() == 3
    assert report["lm loss"].tolist() == [10.0, 3.0]


def _synthetic(recipe: str, *overrides: str):
    from recipes.config.overrides import apply_overrides

    cfg = apply_overrides(
        get_recipe(recipe), ["data.source=synthetic", "data.max_corpus_bytes=60000", *overrides]
    )
    train, _ = in_memory_sources(cfg)
    return cfg, train


def test_dp_ranks_split_each_global_batch_exactly_once():
    cfg, samples = _synthetic("tiny_dp2")
    ranks = [GlobalBatches(samples, cfg, dp) for dp in range(2)]
    for step in (0, 3):
        rows = [mb["tokens"] for r in ranks for mb in r.microbatches(step)]
        assert all(row.shape == (2, cfg.model.seq_length) for row in rows)
        expected = samples.samples[ranks[0].global_batch_indices(step)][:, :-1]
        assert np.array_equal(torch.cat(rows).numpy(), expected)


def test_a_ranks_microbatch_indices_are_the_samples_of_its_microbatches():
    cfg, samples = _synthetic("tiny_dp2")
    second = GlobalBatches(samples, cfg, 1)
    indices = second.microbatch_indices(3)
    assert [len(chunk) for chunk in indices] == [cfg.train.micro_batch_size] * len(indices)
    for chunk, mb in zip(indices, second.microbatches(3), strict=True):
        assert torch.equal(samples.microbatch(chunk)["tokens"], mb["tokens"])
    half = cfg.train.global_batch_size // 2
    assert np.array_equal(np.concatenate(indices), second.global_batch_indices(3)[half:])


def _with_id(samples: TokenTable, sample: int, position: int, value: int) -> TokenTable:
    rows = samples.samples.copy()
    rows[sample, position] = value
    return TokenTable(rows, samples.eod, samples.eod_mask_loss, source_names=("bare",))


RAISE = "prepare it again with this model's tokenizer, or raise model.vocab_size to 301 or more"


@pytest.mark.parametrize(("position", "value", "fix"), [
    (5, 300, RAISE),  # an input token
    (-1, 300, RAISE),  # the last label alone
    (0, -7, "the files were not written as token ids; prepare them again"),
])
def test_an_id_outside_the_vocabulary_is_named_with_its_sample_and_source(position, value, fix):
    cfg, clean = _synthetic("tiny_dp1")
    samples = _with_id(clean, 11, position, value)
    chunk = np.array([4, 11, 2])
    assert batch_outside_vocabulary(clean.microbatch(chunk), chunk, clean, 256) is None
    problem = batch_outside_vocabulary(samples.microbatch(chunk), chunk, samples, 256)
    assert problem == (f"sample 11 of source bare holds token id {value}, outside the model's "
                       "vocabulary (model.vocab_size=256): the data was tokenized for another "
                       f"vocabulary; {fix}")


def test_only_the_rank_whose_share_holds_a_bad_id_refuses_its_batch():
    """Each DP rank reads its own share of a batch: the rank that meets the id says so (as a
    mistake it met alone), the other trains on."""
    cfg, clean = _synthetic("tiny_dp2")
    step = 2
    second_half = GlobalBatches(clean, cfg, 1).microbatch_indices(step)[0]
    samples = _with_id(clean, int(second_half[0]), 3, 999)
    first, second = (GlobalBatches(samples, cfg, dp) for dp in range(2))
    assert len(first.microbatches(step)) == len(second.microbatches(step - 1))
    with pytest.raises(RankUserError, match=f"sample {second_half[0]:,} of source bare holds "
                       "token id 999"):
        second.microbatches(step)


def test_the_bare_benchmark_step_reads_each_microbatch_once_for_all_model_chunks():
    from trainer.tools.benchmarks.step import ReadOnDemand

    cfg, samples = _synthetic("tiny_dp1")
    reads = []

    class Counted:
        def microbatch(self, indices):
            reads.append(indices.tolist())
            return samples.microbatch(indices)

    indices = GlobalBatches(samples, cfg, 0).microbatch_indices(0)
    batches = ReadOnDemand(Counted(), indices)
    first, second = iter(batches), iter(batches)  # two interleaved model chunks
    assert torch.equal(next(first)["tokens"], next(second)["tokens"])
    assert reads == [indices[0].tolist()]  # read when first asked for, once
    assert len(list(first)) == len(indices) - 1 and len(list(second)) == len(indices) - 1
    assert reads == [chunk.tolist() for chunk in indices]


def test_labels_are_inputs_shifted_by_one_and_eod_inputs_carry_no_loss():
    cfg, samples = _synthetic("tiny_dp1")
    batches = GlobalBatches(samples, cfg, 0)
    mb = batches.microbatches(0)[0]
    assert torch.equal(mb["tokens"][:, 1:], mb["labels"][:, :-1])
    assert torch.all(mb["loss_mask"][mb["tokens"] == samples.eod] == 0)
    assert torch.all(mb["loss_mask"][mb["tokens"] != samples.eod] == 1)
    total = sum(int(m["loss_mask"].sum()) for m in batches.microbatches(0))
    rows = samples.samples[batches.global_batch_indices(0)]
    assert total == int((rows[:, :-1] != samples.eod).sum())


def test_epochs_reshuffle_and_cover_every_sample():
    cfg, samples = _synthetic("tiny_dp1")
    batches = GlobalBatches(samples, cfg, 0)
    per_epoch = len(samples) // cfg.train.global_batch_size
    first = np.concatenate([batches.global_batch_indices(s) for s in range(per_epoch)])
    second = np.concatenate([batches.global_batch_indices(per_epoch + s) for s in range(2)])
    assert len(set(first.tolist())) == len(first)
    assert not np.array_equal(first[: len(second)], second)


def _scheduler(style: str):
    from recipes.config.overrides import apply_overrides
    from trainer.session import build_scheduler

    cfg = apply_overrides(get_recipe("tiny_dp1"), [
        f"scheduler.style={style}", "train.train_iters=100", "scheduler.warmup_iters=10",
        "scheduler.wsd_decay_iters=20", "optimizer.lr=1.0", "optimizer.min_lr=0.1",
    ])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(cfg, optimizer)
    lrs = []
    for _ in range(100):
        scheduler.step(increment=cfg.train.global_batch_size)
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


def test_cosine_schedule_warms_up_then_decays_to_min():
    lrs = _scheduler("cosine")
    assert lrs[4] == pytest.approx(0.5)
    assert lrs[9] == pytest.approx(1.0)
    assert lrs[54] == pytest.approx(0.55, abs=0.01)
    assert lrs[-1] == pytest.approx(0.1)


def test_wsd_schedule_holds_then_anneals_in_the_last_steps():
    lrs = _scheduler("wsd")
    assert lrs[9] == pytest.approx(1.0)
    assert lrs[79] == pytest.approx(1.0)  # stable until the last 20 steps
    assert lrs[89] == pytest.approx(0.55, abs=0.01)
    assert lrs[-1] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("recipe", "overlap", "batch"),
    [("tiny_pp2", False, True), ("tiny_pp2_vpp2", True, False)],
)
def test_only_an_interleaved_pipeline_overlaps_and_unbatches_its_p2p(recipe, overlap, batch):
    from trainer.mcore_translation import build_transformer_config

    config = build_transformer_config(get_recipe(recipe), cpu_initialization=True)
    assert (config.overlap_p2p_comm, config.batch_p2p_comm) == (overlap, batch)
    assert config.calculate_per_token_loss


def test_swiglu_and_squared_relu_translate_to_megatron_activations():
    from megatron.core.activations import squared_relu

    from trainer.mcore_translation import build_transformer_config

    llama = build_transformer_config(get_recipe("llama3_8b_tp8_dp8"), cpu_initialization=True)
    nemotron = build_transformer_config(
        get_recipe("nemotron4_15b_tp8_pp2_dp4"), cpu_initialization=True
    )
    assert llama.gated_linear_unit and llama.activation_func is torch.nn.functional.silu
    assert not nemotron.gated_linear_unit and nemotron.activation_func is squared_relu
    assert llama.num_query_groups == 8 and llama.params_dtype == torch.bfloat16


def test_manual_gc_collects_every_interval_with_automatic_collection_off():
    import gc

    from trainer.loop import manual_gc

    collected = []
    original = gc.collect
    gc.collect = lambda *args: collected.append(args) or 0
    try:
        with manual_gc(3) as collect:
            assert not gc.isenabled()
            for step in range(1, 8):
                collect(step)
        assert gc.isenabled() and len(collected) == 1 + 2  # once on entry, steps 3 and 6
        with manual_gc(0) as collect:
            assert gc.isenabled()
            collect(3)
        assert len(collected) == 3
    finally:
        gc.collect = original


def test_data_set_up_waits_longer_than_a_collective_then_the_usual_timeout_returns(tmp_path):
    """The default group's timeout is the data-setup one while the indexes are built, the
    collective one again afterwards (read back from the group itself)."""
    from datetime import timedelta

    import torch

    from trainer.session import patient_collectives

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                                         rank=0, world_size=1,
                                         timeout=timedelta(minutes=10))
    try:
        group = torch.distributed.distributed_c10d._get_default_group()

        def timeout() -> timedelta:
            return group._get_backend(torch.device("cpu")).options._timeout

        with patient_collectives(60, 10):
            assert timeout() == timedelta(minutes=60)
        assert timeout() == timedelta(minutes=10)
    finally:
        torch.distributed.destroy_process_group()

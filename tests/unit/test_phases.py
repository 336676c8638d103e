"""Phases in a recipe: resolution to steps, the one schedule across them, and each phase rule
firing alone with its one-line message."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.config.phases import phase_spans, samples_at, schedule_samples
from recipes.config.validation import failing_rules, rule_problems, validate
from recipes.registry import get_recipe

REPO = Path(__file__).resolve().parents[2]
RUN = ["train.train_iters=20", "scheduler.warmup_iters=2"]
TWO_BY_STEP = "phases=[{name: general, end_step: 12}, {name: quality, end_step: 20}]"
LONG = ("phases=[{name: a, end_step: 10, seq_length: 128}, "
        "{name: long, end_step: 20, seq_length: 256, relaunch: true, lr_decay: true}]")
CP_CHANGE = ("phases=[{name: a, end_step: 10, seq_length: 64}, {name: long, end_step: 20, "
             "seq_length: 128, context: 2, relaunch: true}]")
# The last phase packs whole documents into longer rows, each attending to itself only.
BLEND = ["data.source=blend", "data.blend=conf/data/python_stdlib.yaml", "model.vocab_size=2048"]
PACKED_PHASE = ("phases=[{name: a, end_step: 10, seq_length: 128, documents: concatenate}, "
                "{name: long, end_step: 20, seq_length: 256, documents: packed, "
                "micro_batch_size: 1, relaunch: true}]")
TWO_BY_SHARE = ("phases=[{name: general, tokens: 0.5}, "
                "{name: big, tokens: 0.5, global_batch_size: 16}]")


def _cfg(*overrides: str, recipe: str = "tiny_dp1"):
    return apply_overrides(get_recipe(recipe), [*RUN, *overrides])


def test_no_phases_is_one_span_over_the_run() -> None:
    (span,) = phase_spans(_cfg())
    assert (span.start_step, span.end_step, span.global_batch_size) == (0, 20, 8)
    assert span.tokens == 20 * 8 * 128


def test_end_steps_give_the_spans_and_values_chain_from_the_previous_phase() -> None:
    cfg = _cfg("phases=[{name: a, end_step: 5, global_batch_size: 16}, {name: b, end_step: 9}, "
               "{name: c, end_step: 20, global_batch_size: 8}]")
    spans = phase_spans(cfg)
    assert [(s.start_step, s.end_step) for s in spans] == [(0, 5), (5, 9), (9, 20)]
    assert [s.global_batch_size for s in spans] == [16, 16, 8]  # b keeps a's batch
    assert [s.start_sample for s in spans] == [0, 80, 144]
    assert samples_at(spans, 7) == 80 + 2 * 16


def test_token_shares_count_each_phases_tokens_per_step() -> None:
    # Equal token shares, the second phase at twice the batch: it runs half as many steps.
    general, big = phase_spans(_cfg(TWO_BY_SHARE))
    assert (general.steps, big.steps) == (13, 7)  # 20 x 2/3 rounded, the rest
    assert abs(general.tokens - big.tokens) <= big.tokens / big.steps


def test_schedule_without_phases_is_the_plain_sample_count() -> None:
    cfg = _cfg("scheduler.style=wsd", "scheduler.wsd_decay_iters=5")
    s = schedule_samples(cfg)
    assert (s.warmup, s.decay, s.wsd_decay) == (2 * 8, 20 * 8, 5 * 8)


def test_decay_phase_places_the_wsd_anneal() -> None:
    cfg = _cfg("scheduler.style=wsd", "phases=[{name: general, end_step: 14}, "
               "{name: decay, end_step: 20, lr_decay: true, global_batch_size: 16}]")
    s = schedule_samples(cfg)
    assert (s.decay, s.wsd_decay) == (14 * 8 + 6 * 16, 6 * 16)


def test_one_lr_schedule_runs_across_the_phases() -> None:
    """Megatron's scheduler stepped by each phase's batch: stable through the first phase,
    annealed to min_lr over exactly the decay phase."""
    from trainer.session import build_scheduler

    cfg = _cfg("scheduler.style=wsd", "optimizer.lr=1.0", "optimizer.min_lr=0.1",
               "phases=[{name: general, end_step: 14}, "
               "{name: decay, end_step: 20, lr_decay: true, global_batch_size: 16}]")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(cfg, optimizer)
    lrs = []
    for span in phase_spans(cfg):
        for _ in range(span.steps):
            scheduler.step(increment=span.global_batch_size)
            lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[1:14] == [pytest.approx(1.0)] * 13
    assert 0.1 < lrs[16] < 1.0 and lrs[14] > lrs[16] > lrs[18]
    assert lrs[-1] == pytest.approx(0.1)


# (rule, overrides that break only it, text of the one-line message)
PHASE_RULE_CASES = [
    ("check_phase_names", ["phases=[{name: a, end_step: 10}, {name: a, end_step: 20}]"],
     "phases[1] (a): the name is used by an earlier phase; give every phase its own name"),
    ("check_phase_positive", ["phases=[{name: a, end_step: 20, global_batch_size: 0}]"],
     "phases[0] (a): global_batch_size=0 must be at least 1"),
    ("check_phase_end", ["phases=[{name: a, end_step: 10}, {name: b}]"],
     "phases[1] (b) needs exactly one of tokens (its share of the run's tokens) or end_step"),
    ("check_phase_end", ["phases=[{name: a, end_step: 10}, {name: b, tokens: 0.5}]"],
     "phases mix tokens and end_step"),
    ("check_phase_shares", ["phases=[{name: a, tokens: 0.7}, {name: b, tokens: 0.2}]"],
     "phases' token shares add up to 0.9, not 1; make them cover the run (0.7 + 0.2)"),
    ("check_phase_shares", ["phases=[{name: a, tokens: 1.5}, {name: b, tokens: -0.5}]"],
     "phases[1] (b): tokens=-0.5 must be a positive share"),
    ("check_phase_steps", ["phases=[{name: a, end_step: 10}, {name: b, end_step: 8}]"],
     "phases[1] (b): end_step=8 must be after the previous phase's end (10)"),
    ("check_phase_steps", ["phases=[{name: a, end_step: 10}, {name: b, end_step: 15}]"],
     "the last phase ends at step 15 but the run has train.train_iters=20; phases must cover "
     "the run: set its end_step: 20"),
    ("check_phase_lengths", ["phases=[{name: a, tokens: 0.99}, {name: b, tokens: 0.01}]"],
     "phases[1] (b): tokens=0.01 is less than one step of 20"),
    ("check_phase_blend", ["phases=[{name: a, end_step: 20, blend: conf/data/x.yaml}]"],
     "phases[0] (a): blend=conf/data/x.yaml needs data.source=blend"),
    ("check_phase_relaunch", ["phases=[{name: a, end_step: 20, relaunch: true, "
                              "seq_length: 128}]"],
     "phases[0] (a): relaunch: true on the first phase starts from nothing"),
    ("check_phase_relaunch",
     ["phases=[{name: a, end_step: 10}, {name: long, end_step: 20, seq_length: 256}]"],
     "phases[1] (long): changing seq_length (128 -> 256) needs a new launch; set relaunch: true"),
    ("check_relaunch_sequences_given", ["phases=[{name: a, end_step: 10}, {name: long, "
                                        "end_step: 20, seq_length: 256, relaunch: true}]"],
     "phases[0] (a): a run with relaunch phases names every phase's seq_length; set "
     "seq_length: 128 on it"),
    ("check_relaunch_saves", ["checkpoint.save=false", LONG.replace(", lr_decay: true", "")],
     "phases with relaunch: true continue from the checkpoint the launch before saves at their "
     "start, but checkpoint.save=false; set checkpoint.save=true"),
    ("check_relaunch_saves", ["cluster.gpus_per_node=2", "optimizer.distributed=true",
                              CP_CHANGE], "a relaunch phase changes parallel.context, a new "
     "layout, and the distributed optimizer's dp_reshardable state reshards over DP only; set "
     "checkpoint.optimizer_format=fully_reshardable"),
    ("check_phase_lr_decay", ["phases=[{name: a, end_step: 20, lr_decay: true}]"],
     "phases[0] (a): lr_decay: true places a warm-up–stable–decay schedule's decay, but "
     "scheduler.style=cosine; set scheduler.style=wsd"),
    ("check_phase_lr_decay", ["scheduler.style=wsd", "phases=[{name: a, end_step: 10, "
                              "lr_decay: true}, {name: b, end_step: 20, lr_decay: true}]"],
     "phases a, b all set lr_decay; the one schedule decays once"),
    ("check_phase_lr_decay", ["scheduler.style=wsd", "scheduler.wsd_decay_iters=4",
                              "phases=[{name: a, end_step: 20, lr_decay: true}]"],
     "scheduler.decay_iters and scheduler.wsd_decay_iters must stay null"),
    ("check_phase_layouts", ["phases=[{name: a, end_step: 10}, "
                             "{name: b, end_step: 20, global_batch_size: 7}]"],
     "phases[1] (b): train.global_batch_size=7"),
    ("check_phase_layouts", ["phases=[{name: a, end_step: 10, seq_length: 128}, {name: b, "
                             "end_step: 20, context: 2, relaunch: true, seq_length: 128}]"],
     "phases[1] (b): world size 1 (1 node x 1) is not divisible by TP1 x PP1 x CP2 = 2"),
    # A phase of packed rows meets the packing plugin's rules (one row per micro-batch).
    ("check_phase_layouts", [*BLEND, PACKED_PHASE.replace(", micro_batch_size: 1", "")],
     "phases[1] (long): data.documents=packed makes packed rows, which need "
     "train.micro_batch_size=1"),
    # ... and keeps the end-of-document mask its packed rows need.
    ("check_phase_layouts", [*BLEND, "data.eod_mask_loss=false", PACKED_PHASE],
     "phases[1] (long): data.documents=packed needs data.eod_mask_loss=true"),
    ("check_phase_relaunch", [*BLEND, "phases=[{name: a, end_step: 10, documents: concatenate}, "
                              "{name: b, end_step: 20, documents: packed, micro_batch_size: 1}]"],
     "phases[1] (b): changing documents (concatenate -> packed) needs a new launch"),
    ("check_phase_documents_given", [*BLEND, PACKED_PHASE.replace(", documents: concatenate}",
                                                                   "}")],
     "phases[0] (a): a phase of this run names its documents, so every phase does; set "
     "documents: concatenate on it"),
    ("check_phase_blend", ["phases=[{name: a, end_step: 20, documents: packed}]"],
     "phases[0] (a): documents: packed needs prepared data (data.source=blend)"),
]


@pytest.mark.parametrize(("rule", "overrides", "message"), PHASE_RULE_CASES,
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in PHASE_RULE_CASES])
def test_phase_rule_fires_alone_with_its_message(rule, overrides, message) -> None:
    cfg = _cfg(*overrides)
    assert failing_rules(cfg) == [rule]
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("mistake", [
    ["data.documents=packed", "train.micro_batch_size=1", "data.eod_mask_loss=false"],
    ["train.global_batch_size=7"]], ids=["mask", "batch"])
def test_a_mistake_the_phases_inherit_is_said_once_by_the_runs_rule(mistake) -> None:
    """A run-level setting every phase inherits is the run's rule's to refuse: the phases'
    check does not say it again for phase a."""
    cfg = _cfg(*BLEND, *mistake, "phases=[{name: a, end_step: 10}, {name: b, end_step: 20}]")
    problems = rule_problems(cfg)
    assert len(problems) == 1 and not problems[0].startswith("phases[")


def test_valid_phases_break_no_rule() -> None:
    for overrides in ([TWO_BY_STEP], [TWO_BY_SHARE], [
        "scheduler.style=wsd", LONG]):
        assert failing_rules(_cfg(*overrides)) == []


def test_a_packed_phase_trains_its_own_rows_and_micro_batch() -> None:
    from recipes.config.phases import launch_layout, phase_config

    cfg = _cfg(*BLEND, PACKED_PHASE)
    assert failing_rules(cfg) == []
    short, long = phase_spans(cfg)
    assert (short.documents, long.documents) == ("concatenate", "packed")
    packed = phase_config(cfg, long)
    assert (packed.data.documents, packed.train.micro_batch_size, packed.model.seq_length) == (
        "packed", 1, 256)
    assert packed.plugins.packing.active(packed) and not cfg.plugins.packing.active(cfg)
    assert launch_layout(cfg, 10) == ["model.seq_length=256", "parallel.context=1",
                                      "data.documents=packed", "train.micro_batch_size=1"]


def test_phase_tokens_count_the_batch_ramp_as_the_schedule_does() -> None:
    """One count of samples: a phase's tokens are the schedule's samples over its steps."""
    from recipes.config.phases import run_samples_at
    from recipes.config.rampup import ramp_schedule, samples_after

    cfg = _cfg("train.rampup_batch_size=[2,2,40]", TWO_BY_STEP)
    ramp = ramp_schedule(cfg)
    spans = phase_spans(cfg)
    for span in spans:
        assert span.start_sample == samples_after(ramp, span.start_step)
        assert span.samples == samples_after(ramp, span.end_step) - span.start_sample
        assert span.samples == run_samples_at(cfg, span.end_step) - run_samples_at(
            cfg, span.start_step)
    assert spans[0].samples < spans[0].steps * cfg.train.global_batch_size  # the ramp counted
    assert sum(s.samples for s in spans) == samples_after(ramp, cfg.train.train_iters)


def test_nemotron4_pretraining_phase_is_its_reported_8t_tokens() -> None:
    """Nemotron-4 15B report, Table 2: 0.2T tokens at batch 384, 0.2T at 768, 7.6T at 1152."""
    cfg = get_recipe("nemotron4_15b_phases_tp8_pp2_dp4")
    pretraining, continued = phase_spans(cfg)
    step_tokens = cfg.train.global_batch_size * cfg.model.seq_length
    assert abs(pretraining.tokens - 8e12) <= step_tokens
    assert abs(continued.tokens - 1e12) <= step_tokens


def test_a_launch_ends_where_a_relaunch_phase_starts_and_the_next_starts_in_its_layout() -> None:
    from recipes.config.phases import (
        continue_overrides,
        launch_end,
        launch_finished,
        launch_layout,
        launch_mismatch,
        launch_starts,
        launch_stop,
    )

    cfg = _cfg("scheduler.style=wsd", LONG)
    spans = phase_spans(cfg)
    assert (launch_end(spans, 0), launch_end(spans, 7), launch_end(spans, 10)) == (10, 10, 20)
    assert [span.name for span in launch_starts(spans)] == ["a", "long"]
    assert launch_mismatch(cfg, 0) is None  # phase a trains at the run's 128
    assert launch_mismatch(cfg, 12) == (
        "step 12 is in phases[1] (long), which trains with model.seq_length=256, but this "
        "launch has model.seq_length=128; start it with model.seq_length=256 parallel.context=1 "
        "data.documents=concatenate train.micro_batch_size=2")
    # The phase comes from the step the launch resumes at: which layout it needs, and at the
    # boundary in phase a's layout (a requeue after its last save) nothing is left to train.
    assert launch_layout(cfg, 7) == [] and launch_layout(cfg, 10) == launch_layout(cfg, 12) \
        == ["model.seq_length=256", "parallel.context=1", "data.documents=concatenate",
            "train.micro_batch_size=2"]
    assert launch_finished(cfg, 10) and not launch_finished(cfg, 9)
    assert launch_mismatch(cfg, 10) is None and launch_stop(cfg, 10) == 10
    assert launch_stop(cfg, 4) == 10
    relaunched = _cfg("scheduler.style=wsd", LONG, "model.seq_length=256")
    assert launch_mismatch(relaunched, 10) is None and not launch_finished(relaunched, 10)
    assert launch_stop(relaunched, 10) == 20
    assert phase_spans(relaunched) == spans  # every phase names its length: nothing moves
    assert continue_overrides(spans[1]) == [  # the resume, never a first checkpoint.load
        "checkpoint.load=null", "checkpoint.load_model_only=false", "checkpoint.resume=true",
        "model.seq_length=256", "parallel.context=1", "data.documents=concatenate",
        "train.micro_batch_size=2"]
    resumed = _cfg("scheduler.style=wsd", LONG, "checkpoint.load=/pretrained",
                   *continue_overrides(spans[1]), "run_dir=/runs/x")
    assert (resumed.checkpoint.load, resumed.checkpoint.resume) == (None, True)


PHASED_NEMOTRON = {  # recipe: the published tokens of each phase, then of the WSD decay window
    # Nano 2 report (§2.2, 2.5, 2.6): phases switch at 60% and 90% of 20T, decay over the final
    # 3.6T, then 18.9B long-context tokens.
    "nemotron_nano_v2_12b_phases_tp4_sp_dp16": ((12e12, 6e12, 2e12, 18.9e9), (16.4e12, 20e12)),
    # Nemotron 3 Nano (card, NVIDIA's docs): 23.5T + 1.5T, decay over the final 5T, 121B LC.
    "nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16": ((23.5e12, 1.5e12, 121e9), (20e12, 25e12)),
}


@pytest.mark.parametrize("name", sorted(PHASED_NEMOTRON))
def test_phased_nemotron_recipes_train_their_token_counts_on_blends_that_exist(name) -> None:
    cfg = get_recipe(name)
    validate(cfg)
    spans = phase_spans(cfg)
    tokens, (decay_start, decay_end) = PHASED_NEMOTRON[name]
    for span, published in zip(spans, tokens, strict=True):
        step_tokens = span.global_batch_size * span.seq_length
        assert abs(span.tokens - published) <= step_tokens, span.name
        assert (REPO / span.blend).is_file(), span.blend
    # The decay window, in the main phases' tokens, ends where the long-context phase starts:
    # Megatron then holds min_lr, the long-context phase's published constant lr.
    schedule, seq = schedule_samples(cfg), cfg.model.seq_length
    step_tokens = cfg.train.global_batch_size * seq
    assert abs((schedule.decay - schedule.wsd_decay) * seq - decay_start) <= step_tokens
    assert abs(schedule.decay * seq - decay_end) <= step_tokens
    assert schedule.decay == spans[-1].start_sample
    assert spans[-1].relaunch and spans[-1].context > spans[0].context

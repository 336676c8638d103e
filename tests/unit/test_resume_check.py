"""The continuous-vs-resumed checks of `scripts/validate_resume.py` on hand-made records: each
kind of difference fails its own row only, and bad options are one line before any launch."""

from __future__ import annotations

import dataclasses

import pytest

from trainer.entry.commands import VALIDATE_RESUME
from trainer.entry.contract import main
from trainer.tools.resume_check import StepRecord, compare, format_table

RECORDS = [StepRecord(2.5, 1e-3, 100, "aa"), StepRecord(2.4, 9e-4, 200, "bb")]
SAME_RNG = ("r1", "r1", "r2", "r2")


def _failing(rows: list[tuple]) -> list[str]:
    return [check for check, _, ok in rows if not ok]


def test_identical_runs_pass_every_check():
    assert _failing(compare(RECORDS, list(RECORDS), SAME_RNG)) == []


@pytest.mark.parametrize(("change", "check"), [
    ({"loss": 2.4000001}, "loss"),
    ({"lr": 8e-4}, "learning rate"),
    ({"tokens": 201}, "consumed tokens"),
    ({"data": "cc"}, "data order"),
])
def test_each_difference_fails_its_own_row(change, check):
    resumed = [RECORDS[0], dataclasses.replace(RECORDS[1], **change)]
    assert _failing(compare(RECORDS, resumed, SAME_RNG)) == [check]


def test_rng_streams_that_differ_after_the_load_fail():
    assert _failing(compare(RECORDS, list(RECORDS), ("r1", "rX", "r2", "r2"))) == ["RNG streams"]


def test_table_names_each_check_and_the_verdict():
    rows = compare(RECORDS, [RECORDS[0], dataclasses.replace(RECORDS[1], data="cc")], SAME_RNG)
    text = format_table("tiny_dp1", rows, {"steps": 4, "save_at": 2})
    assert "  data order       FAIL    1 of 2 batches with identical token ids" in text
    assert text.splitlines()[-1] == "resume is NOT exact"


def test_save_at_not_below_steps_is_one_line_before_launch(capsys):
    assert main(VALIDATE_RESUME, ["recipe=tiny_dp1", "steps=3", "save_at=3"]) == 2
    assert capsys.readouterr().err == ("error: save_at=3 must be below steps=3, e.g. steps=6\n")


@pytest.mark.parametrize(("override", "named"), [
    ("checkpoint.load=runs/x/checkpoints", "checkpoint.load=runs/x/checkpoints"),
    ("checkpoint.resume=true", "checkpoint.resume=true"),
])
def test_a_checkpoint_given_to_the_check_is_refused_not_ignored(override, named):
    """The check trains its own run from step 0 and resumes its own save: a checkpoint named
    to it would be ignored (while the launch said it resumes from it)."""
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe
    from trainer.tools.resume_check import loading_refusal

    cfg = apply_overrides(get_recipe("tiny_dp1"), [override])
    assert loading_refusal(cfg) == (
        f"scripts/validate_resume.py trains its own run from step 0 and resumes it from its own "
        f"checkpoint, so {named} would be ignored; drop checkpoint.load and checkpoint.resume "
        "(to continue a checkpoint, use scripts/pretrain.py)")
    assert loading_refusal(get_recipe("tiny_dp1")) is None


def test_a_checkpoint_given_to_the_check_is_one_line_before_launch(capsys, tmp_path):
    assert main(VALIDATE_RESUME, ["recipe=tiny_dp1", "steps=4", "save_at=2",
                                  f"checkpoint.load={tmp_path}"]) == 2
    assert capsys.readouterr().err == (
        "error: scripts/validate_resume.py trains its own run from step 0 and resumes it from "
        f"its own checkpoint, so checkpoint.load={tmp_path} would be ignored; drop "
        "checkpoint.load and checkpoint.resume (to continue a checkpoint, use "
        "scripts/pretrain.py)\n")


def test_a_config_that_never_saves_is_refused_not_passed():
    """The check's own save would make it pass a config whose job cannot resume."""
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe
    from trainer.tools.resume_check import saving_refusal

    assert saving_refusal(apply_overrides(get_recipe("tiny_dp1"), ["checkpoint.save=false"])) == (
        "checkpoint.save=false: a job with this config saves no checkpoint, so it cannot resume, "
        "while scripts/validate_resume.py makes its own save and would pass; check the config "
        "the job will run, with checkpoint.save=true")
    assert saving_refusal(get_recipe("tiny_dp1")) is None


def test_a_config_that_never_saves_is_one_line_before_launch(capsys):
    assert main(VALIDATE_RESUME, ["recipe=tiny_dp1", "checkpoint.save=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint.save=false: a job with this config saves no ")
    assert err.count("\n") == 1

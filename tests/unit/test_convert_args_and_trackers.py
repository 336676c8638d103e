"""convert.py's command line mistakes named as typed (`cli.command_problem`,
`cli.misspelled_option`); a root whose `latest` file or Megatron-LM tracker names no complete
step says so in one `resume:` line (`format.fallback_note`); this project's own Megatron-LM-layout
step that lost its `run.json` still states what it resumes from (`megatron_lm.OWN`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.resolve import resolve_config
from tests.dcp_steps import dcp_step
from trainer.checkpoint.format import LATEST_FILE, MEGATRON_LM_TRACKER, fallback_note
from trainer.checkpoint.preflight import checkpoint_preflight
from trainer.entry.commands import CONVERT
from trainer.entry.contract import parse_arguments
from trainer.interop import cli

REPO = Path(__file__).resolve().parents[2]
NEEDS_COMMAND = ("convert.py needs a command first: import or export (e.g. convert.py import "
                 "hf=DIR out=DIR recipe=NAME)")


def _parse(argv: list[str]) -> cli.Request:
    args = parse_arguments(CONVERT, argv)
    return cli.make_request(args.rest, args.options)


@pytest.mark.parametrize("words, expected", [
    ([], NEEDS_COMMAND),
    (["recipe=tiny_dp1"], NEEDS_COMMAND),  # hf= and out= are options: the override is first
    (["recipe=tiny_dp1", "import"], NEEDS_COMMAND),
    (["improt"], "convert.py has no command 'improt'; did you mean import? (--help shows usage)"),
    (["import", "recipe=tiny_dp1"], None),
    (["export"], None),
])
def test_the_command_comes_first(words, expected) -> None:
    assert cli.command_problem(words) == expected


@pytest.mark.parametrize("command, rest, expected", [
    ("import", ["hf_dir=/m"], "unknown option hf_dir; did you mean hf=?"),
    ("import", ["recipe=x", "output=/o"], "unknown option output; did you mean out=?"),
    ("export", ["max_shard=5"], "unknown option max_shard; did you mean max_shard_size=?"),
    ("import", ["recipe=x", "run_dir=/r", "model.num_layers=2", "config=c.yaml"], None),
    ("import", ["recipe=x", "zzz=1"], None),  # the override's own check names it
])
def test_a_misspelled_option_is_named_with_the_option(command, rest, expected) -> None:
    assert cli.misspelled_option(command, rest) == expected


def test_the_command_line_refusals_come_before_a_missing_option(tmp_path) -> None:
    with pytest.raises(ConfigError, match="^unknown option hf_dir; did you mean hf=\\?$"):
        _parse(["import", f"hf_dir={tmp_path}", f"out={tmp_path / 'o'}", "recipe=tiny_dp1"])
    with pytest.raises(ConfigError) as caught:
        _parse([f"hf={tmp_path}", f"out={tmp_path / 'o'}", "recipe=tiny_dp1"])
    assert str(caught.value) == NEEDS_COMMAND


def test_no_command_is_one_line_and_exit_2(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", f"hf={tmp_path}", f"out={tmp_path / 'o'}",
         "recipe=tiny_dp1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == f"error: {NEEDS_COMMAND}\n"


def _step(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return path


@pytest.mark.parametrize("files, expected", [
    ({MEGATRON_LM_TRACKER: "abc"}, "latest_checkpointed_iteration.txt names 'abc', no complete "
     "step; resuming from the newest complete one, iter_0000004"),
    ({MEGATRON_LM_TRACKER: "7"}, "latest_checkpointed_iteration.txt names '7', no complete "
     "step; resuming from the newest complete one, iter_0000004"),
    ({LATEST_FILE: "iter_0000006"}, "latest names 'iter_0000006', no complete step; resuming "
     "from the newest complete one, iter_0000004"),
    ({LATEST_FILE: "iter_0000009", MEGATRON_LM_TRACKER: "abc"}, "latest names 'iter_0000009' "
     "and latest_checkpointed_iteration.txt names 'abc', no complete step; resuming from the "
     "newest complete one, iter_0000004"),
    ({MEGATRON_LM_TRACKER: "2"}, None),  # what it names is resumed
    ({LATEST_FILE: "iter_0000006", MEGATRON_LM_TRACKER: "4"}, None),  # the tracker's is
    ({}, None),  # no file to contradict: the newest step is the rule
])
def test_a_tracker_naming_no_complete_step_is_said(tmp_path, files, expected) -> None:
    root = tmp_path / "save"
    _step(root / "iter_0000002")
    _step(root / "iter_0000004")
    (root / "iter_0000006").mkdir()  # a save the crash left without its marker
    for name, text in files.items():
        (root / name).write_text(text)
    assert fallback_note(root) == expected


def test_our_latest_naming_a_missing_step_is_said(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    _step(root / "step_0000002")
    (root / LATEST_FILE).write_text("step_0000004")
    assert fallback_note(root) == ("latest names 'step_0000004', no complete step; resuming "
                                   "from the newest complete one, step_0000002")
    (root / LATEST_FILE).write_text("step_0000002")
    assert fallback_note(root) is None


def _load(load: Path, *overrides: str):
    return resolve_config(["recipe=tiny_dp1", f"checkpoint.load={load}", *overrides])


@pytest.mark.parametrize("name, text", [(MEGATRON_LM_TRACKER, "abc"),
                                        (MEGATRON_LM_TRACKER, "7"),
                                        (LATEST_FILE, "iter_0000007")])
def test_the_preflight_says_the_fallback_first(tmp_path, name, text) -> None:
    root = tmp_path / "save"
    dcp_step(root / "iter_0000002")
    dcp_step(root / "iter_0000004")
    (root / name).write_text(text)
    notes = checkpoint_preflight(_load(root, "checkpoint.load_model_only=true"))
    assert notes == [f"{name} names '{text}', no complete step; resuming from the newest "
                     "complete one, iter_0000004"]
    # one step named directly: nothing fell back
    assert checkpoint_preflight(_load(root / "iter_0000004",
                                      "checkpoint.load_model_only=true")) == []


def _own_step_without_run_json(path: Path) -> Path:
    """A step as checkpoint.format=megatron_lm saves it, its run.json gone: this project's
    `run_state` and Megatron-LM's `args` in the common state, an optimizer key."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    common = {"run_state": {"step": 4, "consumed_samples": 32, "consumed_tokens": 4096,
                            "skipped_steps": 0, "data": {}, "plugins": {}, "world_size": 1},
              "args": argparse.Namespace(consumed_train_samples=32, world_size=1),
              "iteration": 4, "checkpoint_version": 3.0}
    state = {"a": torch.arange(16.0), "optimizer.x": torch.ones(4),
             "common_state/shard_0_1": [common], "rng_state/shard_0.0_1.1": [[]]}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True,
             planner=DefaultSavePlanner(flatten_state_dict=False))
    return path


def test_our_own_step_without_run_json_says_what_it_resumes(tmp_path) -> None:
    from trainer.checkpoint.megatron_lm import OWN, foreign_manifest

    step = _own_step_without_run_json(tmp_path / "checkpoints" / "iter_0000004")
    manifest = foreign_manifest(step)
    assert manifest["writer"] == OWN
    assert (manifest["step"], manifest["consumed_samples"], manifest["consumed_tokens"]) == (
        4, 32, 4096)
    notes = checkpoint_preflight(_load(step.parent, "train.train_iters=6",
                                       "scheduler.warmup_iters=1"))
    assert notes[0] == (f"resuming from {step} (step 4, 32 samples, 4096 loss tokens; saved by "
                        "mcore-recipes, its run.json missing: files and tokenizer are not "
                        "checked, changes are not stated)")
    phased = _load(step.parent, "train.train_iters=6", "scheduler.warmup_iters=1",
                   "phases=[{name: a, end_step: 5}, {name: b, end_step: 6}]")
    from trainer.checkpoint.megatron_lm import foreign_resume_problem

    assert foreign_resume_problem(phased, manifest) is None  # its own state keeps each phase's


def test_a_shard_size_with_a_unit_gets_an_example_in_bytes(tmp_path) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(["export", f"checkpoint={tmp_path}", f"out={tmp_path / 'o'}", "max_shard_size=5GB"])
    assert str(caught.value) == ("max_shard_size expects an integer or null, got '5GB'; e.g. "
                                 "max_shard_size=2147483648")

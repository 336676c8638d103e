"""`checkpoint.resume=true` resolved before any rank starts, on a fake run directory.

A requeued Slurm job reruns pretrain.py with `run_dir=<dir> checkpoint.resume=true`; the path
step turns that into `checkpoint.load=<run_dir>/checkpoints` when the run has a complete
checkpoint (so every `checkpoint.load` check and the run.json pre-flight apply), or into a fresh
start said in one line. The real two-start run is tests/dist/test_requeue_resume.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import save_config
from recipes.config.overrides import apply_overrides
from recipes.config.validation import validate
from recipes.registry import get_recipe
from recipes.resolve import resolve_config
from trainer.checkpoint.preflight import check_checkpoint_load_path, resolve_resume, validate_paths


def _cfg(run_dir: Path, *overrides: str):
    return apply_overrides(get_recipe("tiny_dp1"),
                           [f"run_dir={run_dir}", "checkpoint.resume=true", *overrides])


def _complete(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return path


def test_a_run_with_a_complete_checkpoint_resumes_from_its_root(tmp_path) -> None:
    _complete(tmp_path / "run" / "checkpoints" / "step_0000002")
    (tmp_path / "run" / "checkpoints" / "step_0000003.tmp-3-ab12").mkdir()  # a crashed save
    resolved, note = resolve_resume(_cfg(tmp_path / "run"))
    assert note is None
    assert resolved.checkpoint.load == str((tmp_path / "run" / "checkpoints").resolve())
    assert resolved.checkpoint.resume is False
    validate(resolved)  # a plain checkpoint.load now: no rule about resume fires
    assert check_checkpoint_load_path(resolved) is None


@pytest.mark.parametrize("leftovers", [[], ["checkpoints/step_0000001.tmp-1-ab12"]])
def test_a_new_run_dir_starts_fresh_in_one_line(tmp_path, leftovers) -> None:
    for leftover in leftovers:
        (tmp_path / "run" / leftover).mkdir(parents=True)
    resolved, note = resolve_resume(_cfg(tmp_path / "run"))
    assert (resolved.checkpoint.load, resolved.checkpoint.resume) == (None, False)
    assert note == f"run_dir={tmp_path / 'run'} holds no checkpoint yet; starting from step 0"


def test_a_run_dir_with_a_config_but_no_checkpoint_starts_again(tmp_path, capsys,
                                                                 monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)  # the launching process
    run_dir = tmp_path / "run"
    save_config(get_recipe("tiny_dp1"), run_dir / "config.yaml")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest").write_text("step_0000005")  # names a lost directory
    cfg = _cfg(run_dir)
    validate_paths(cfg)  # resolves in place: the entry pipeline's own object
    assert (cfg.checkpoint.load, cfg.checkpoint.resume) == (None, False)
    out = capsys.readouterr().out
    assert out == (f"resume: run_dir={run_dir} has a config.yaml but no complete checkpoint in "
                   f"{run_dir.resolve() / 'checkpoints'} (the last start stopped before its "
                   "first save); starting again from step 0\n")


def test_only_rank_0_prints_the_fresh_start(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    cfg = _cfg(tmp_path / "run")
    validate_paths(cfg)
    assert cfg.checkpoint.resume is False and capsys.readouterr().out == ""


def test_resume_off_or_left_to_the_job_changes_nothing(tmp_path) -> None:
    _complete(tmp_path / "run" / "checkpoints" / "step_0000001")
    plain = apply_overrides(get_recipe("tiny_dp1"), [f"run_dir={tmp_path / 'run'}"])
    assert resolve_resume(plain) == (plain, None)
    launcher = _cfg(tmp_path / "run")
    validate_paths(launcher, resume=False)  # a login node: the job resolves it when it starts
    assert (launcher.checkpoint.load, launcher.checkpoint.resume) == (None, True)


def test_a_run_dir_that_is_a_file_is_reported_by_the_run_dir_rule(tmp_path) -> None:
    (tmp_path / "run").write_text("not a directory")
    cfg = _cfg(tmp_path / "run")
    assert resolve_resume(cfg) == (cfg, None)
    with pytest.raises(ConfigError, match=r"^run_dir=.* is a file, not a directory; "):
        validate_paths(cfg)


def test_the_saved_config_of_a_resumed_run_resolves_on_its_ranks(tmp_path) -> None:
    """Self-launched ranks get `config=<run_dir>/config.yaml run_dir=<run_dir>`: the resolved
    load, with resume off, passes every rule (no `resume and load` refusal)."""
    run_dir = tmp_path / "run"
    _complete(run_dir / "checkpoints" / "step_0000002")
    resolved, _ = resolve_resume(_cfg(run_dir))
    save_config(resolved, run_dir / "config.yaml")
    again = resolve_config([f"config={run_dir / 'config.yaml'}", f"run_dir={run_dir}"])
    validate_paths(again)
    assert again.checkpoint.load == resolved.checkpoint.load and not again.checkpoint.resume


@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/step_0000002",
                                    "checkpoints/step_0000003"])
def test_a_run_dir_inside_the_checkpoints_is_refused_naming_the_run_dir(tmp_path, inside):
    """A run_dir given as the checkpoints folder or one of its steps (complete or not) would
    start a new run inside it; the run directory is named instead."""
    run_dir = tmp_path / "run"
    _complete(run_dir / "checkpoints" / "step_0000002")
    (run_dir / "checkpoints" / "step_0000003").mkdir()  # a step without its marker
    (run_dir / "checkpoints" / "latest").write_text("step_0000002")
    what = "a checkpoints folder" if inside == "checkpoints" else "a checkpoint step"
    with pytest.raises(ConfigError) as caught:
        resolve_resume(_cfg(run_dir / inside))
    assert str(caught.value) == (
        f"run_dir={run_dir / inside} is {what}, not a run directory: checkpoint.resume=true "
        f"would start a new run inside it; set run_dir={run_dir}")


def test_a_run_dir_named_like_a_step_outside_a_checkpoints_folder_resumes(tmp_path):
    run_dir = tmp_path / "runs" / "iter_0000100"  # a user's name for a run, not a step
    run_dir.mkdir(parents=True)
    resolved, note = resolve_resume(_cfg(run_dir))
    assert resolved.checkpoint.load is None and note.endswith("starting from step 0")
    save_root = tmp_path / "save"  # Megatron-LM's --save folder: loaded, not a run_dir
    _complete(save_root / "iter_0000004")
    (save_root / "latest_checkpointed_iteration.txt").write_text("4")
    with pytest.raises(ConfigError, match=f"; continue from it with checkpoint.load={save_root} "
                                          "and a run_dir of its own$"):
        resolve_resume(_cfg(save_root))


def test_a_start_from_step_0_in_a_run_dir_with_checkpoints_is_refused(tmp_path) -> None:
    """Without checkpoint.resume or checkpoint.load a run in a finished run's directory would
    train from step 0 over its log and publish steps beside its own; refused, the ways out
    named. Not refused: the resume, a load from elsewhere, and a root of unfinished saves."""
    from trainer.checkpoint.preflight import check_run_dir_not_reused

    run = tmp_path / "run"
    fresh = apply_overrides(get_recipe("tiny_dp1"), [f"run_dir={run}"])
    (run / "checkpoints" / "step_0000001.tmp-1-ab12").mkdir(parents=True)
    assert check_run_dir_not_reused(fresh) is None  # no complete step: nothing to lose
    _complete(run / "checkpoints" / "step_0000002")
    assert check_run_dir_not_reused(fresh) == (
        f"run_dir={run} holds the checkpoints of a run (newest step_0000002) and this run "
        "would start over from step 0 there; continue that run with checkpoint.resume=true, or "
        f"give this one another run_dir= (or move {run / 'checkpoints'} aside)")
    assert check_run_dir_not_reused(_cfg(run)) is None
    elsewhere = _complete(tmp_path / "other" / "step_0000005")
    assert check_run_dir_not_reused(apply_overrides(
        get_recipe("tiny_dp1"), [f"run_dir={run}", f"checkpoint.load={elsewhere}"])) is None
    assert check_run_dir_not_reused(apply_overrides(get_recipe("tiny_dp1"), [])) is None

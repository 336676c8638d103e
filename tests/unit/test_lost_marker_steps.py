"""A published step (`step_NNNNNNN`, no `.tmp-`) holding `run.json` but no `metadata.json`:
both are written before the rename that publishes it, so the marker was lost since. It is
damage, named with the previous complete step, never passed over for an older step (load of
a root), a fresh start that overwrites it (`checkpoint.resume=true`) or a 'torch DCP in another
format' (load of the step). Megatron-LM's own `iter_` steps (no `run.json`) behave as before.
"""

from __future__ import annotations

from pathlib import Path

from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from tests.unit.checkpoint_damage_fixtures import load_cfg, project_root
from trainer.checkpoint.format import (
    damaged_newest,
    lost_marker,
    newest_checkpoint,
    step_damage,
)
from trainer.checkpoint.preflight import check_checkpoint_load_path, resolve_resume

LOST = ("step_0000006/metadata.json is missing (every published step has one: it is written "
        "before the rename that publishes the step)")


def _lose_marker(step: Path) -> Path:
    (step / "metadata.json").unlink()
    return step


def test_lost_marker_is_a_published_step_with_run_json_only(tmp_path) -> None:
    root = project_root(tmp_path)
    step = _lose_marker(root / "step_0000006")
    assert lost_marker(step) and step_damage(step) == LOST
    assert not lost_marker(root / "step_0000004")
    unfinished = project_root(tmp_path / "b", steps=(6,)) / "step_0000006"
    _lose_marker(unfinished.rename(unfinished.with_name("step_0000006.tmp-6-ab12")))
    assert not lost_marker(tmp_path / "b" / "step_0000006.tmp-6-ab12")


def test_a_megatron_lm_iter_step_without_marker_or_run_json_is_no_damage(tmp_path) -> None:
    project_root(tmp_path, steps=(2,))
    (tmp_path / "iter_0000004").mkdir()  # Megatron-LM writes in place: a save in progress
    (tmp_path / "iter_0000004" / "__0_0.distcp").write_bytes(b"x")
    assert step_damage(tmp_path / "iter_0000004") is None
    assert damaged_newest(tmp_path) is None
    assert newest_checkpoint(tmp_path) == tmp_path / "step_0000002"


def test_a_root_whose_latest_step_lost_it_is_refused_not_passed_over(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = _lose_marker(root / "step_0000006")
    assert damaged_newest(root) == step
    assert check_checkpoint_load_path(load_cfg(root)) == (
        f"checkpoint.load={root}: {LOST}; fall back to the previous complete checkpoint with "
        f"checkpoint.load={root / 'step_0000004'} (or delete {step}: the root then resumes "
        "from it)")


def test_the_step_named_directly_is_damage_not_another_format(tmp_path) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = _lose_marker(root / "step_0000006")
    message = check_checkpoint_load_path(load_cfg(step))
    assert message.startswith(f"checkpoint.load={step}: {LOST}; fall back")
    assert "torch DCP" not in message


def test_resume_of_a_run_whose_only_step_lost_it_is_refused_not_restarted(tmp_path) -> None:
    root = project_root(tmp_path / "run" / "checkpoints", steps=(2,))
    step = root / "step_0000002"
    _lose_marker(step)
    cfg = apply_overrides(get_recipe("tiny_dp1"),
                          [f"run_dir={tmp_path / 'run'}", "checkpoint.resume=true"])
    resolved, note = resolve_resume(cfg)
    assert note is None and resolved.checkpoint.load == str(root.resolve())
    assert check_checkpoint_load_path(resolved) == (
        f"checkpoint.load={root.resolve()}: step_0000002/metadata.json is missing (every "
        "published step has one: it is written before the rename that publishes the step); no "
        "earlier complete checkpoint exists; start without checkpoint.load")

"""The install-once set of patches (`trainer/patch.py`) that the CPU runtime and the step fixes
each apply: the first call decides, later calls change nothing, an unknown name is refused
before anything is installed, and the caller's own work runs around the installers."""

from __future__ import annotations

import pytest

from trainer.patch import PatchSet


def _recording_set(calls: list[str]) -> PatchSet:
    return PatchSet("test patches", {name: (lambda name=name: calls.append(name))
                                     for name in ("first", "second")},
                    ("mode", "first", "second"))


def test_first_call_decides_and_later_calls_change_nothing():
    calls: list[str] = []
    patches = _recording_set(calls)
    patches.install_once(frozenset({"first"}), before=lambda: calls.append("before"),
                         after=lambda skip: calls.append(f"after {sorted(skip)}"))
    patches.install_once()
    patches.install_once(frozenset({"second"}))
    assert calls == ["before", "second", "after ['first']"]
    assert patches.applied == {"mode", "second"}


def test_an_unknown_name_is_refused_before_anything_runs():
    calls: list[str] = []
    patches = _recording_set(calls)
    with pytest.raises(ValueError) as refused:
        patches.install_once(frozenset({"nope"}), before=lambda: calls.append("before"))
    assert str(refused.value) == (
        "unknown test patches ['nope']; known: ('mode', 'first', 'second')")
    assert calls == [] and patches.applied is None
    patches.install_once()  # a refused call decided nothing
    assert calls == ["first", "second"]


def test_a_failing_before_leaves_the_set_undecided():
    patches = _recording_set([])

    def refuse() -> None:
        raise ValueError("threads_per_rank=0 must be at least 1")

    with pytest.raises(ValueError, match="threads_per_rank=0"):
        patches.install_once(before=refuse)
    assert patches.applied is None


def test_step_fixes_refuse_an_unknown_name():
    from trainer.step_fixes import PATCH_NAMES, apply_step_fixes

    with pytest.raises(ValueError) as refused:
        apply_step_fixes(skip=frozenset({"nope"}))
    assert str(refused.value) == f"unknown step fixes ['nope']; known: {PATCH_NAMES}"

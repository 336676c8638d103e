"""The output-directory check creates what it tests and removes it again: ranks run it at the
same time, so one rank may remove a directory another has just found. The check tries again
rather than calling a creatable directory unwritable."""

from __future__ import annotations

import tempfile

from recipes.config import path_rules


def test_a_directory_removed_by_another_rank_mid_check_is_still_creatable(tmp_path, monkeypatch):
    target = tmp_path / "runs"
    real_mkstemp = tempfile.mkstemp
    calls = []

    def other_rank_removes_it_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the other rank's clean-up lands between our mkdir and our probe
            target.rmdir()
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(path_rules.tempfile, "mkstemp", other_rank_removes_it_first)
    assert path_rules.try_create_directory(target) is None
    assert len(calls) == 2 and not target.exists()  # tried again, and left nothing behind


def test_a_directory_that_cannot_be_made_still_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert isinstance(path_rules.try_create_directory(blocker / "runs"), OSError)

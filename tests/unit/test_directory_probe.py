"""The output-directory check creates what it tests and removes it again: ranks run it at the
same time, so one rank may remove a directory another has just found. The check tries again
rather than calling a creatable directory unwritable (whether the directory went between its
mkdir and its probe or inside mkdir), and looks at a path once (one `stat`), so a directory
removed between two looks is never taken for a file."""

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


def test_a_directory_removed_by_another_rank_inside_mkdir_is_still_creatable(tmp_path,
                                                                            monkeypatch):
    # `Path.mkdir(exist_ok=True)` found the other rank's directory, which that rank removed
    # before mkdir's own look that it is one: mkdir raises "File exists".
    target = tmp_path / "runs"
    real_mkdir = path_rules.Path.mkdir
    calls = []

    def removed_between_exists_and_is_dir(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise FileExistsError(17, "File exists", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(path_rules.Path, "mkdir", removed_between_exists_and_is_dir)
    assert path_rules.try_create_directory(target) is None
    assert len(calls) == 2 and not target.exists()


def test_a_file_where_the_directory_should_be_still_fails(tmp_path):
    target = tmp_path / "runs"
    target.write_text("")
    assert isinstance(path_rules.try_create_directory(target), FileExistsError)


def test_a_directory_that_cannot_be_made_still_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert isinstance(path_rules.try_create_directory(blocker / "runs"), OSError)


def test_a_directory_removed_by_another_rank_after_the_first_look_is_not_a_file(tmp_path,
                                                                               monkeypatch):
    # The relative `output_dir=runs` every rank checks at once: one rank's probe makes and
    # removes ./runs while another looks at it. Removed right after our first look, it must be
    # seen as a directory or as absent, never as "a file, not a directory".
    target = tmp_path / "runs"
    target.mkdir()
    real_stat = path_rules.Path.stat
    looks = []

    def other_rank_removes_it_after_the_first_look(self, *args, **kwargs):
        result = real_stat(self, *args, **kwargs)
        if self == target:
            looks.append(1)
            if len(looks) == 1:
                target.rmdir()
        return result

    monkeypatch.setattr(path_rules.Path, "stat", other_rank_removes_it_after_the_first_look)
    assert path_rules.directory_problem("output_dir", str(target), "fix it") is None
    assert looks and not target.exists()


def test_a_file_where_the_directory_or_its_parent_should_be_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert path_rules.directory_problem("run_dir", str(blocker), "fix").startswith(
        f"run_dir={blocker} is a file, not a directory; fix")
    assert path_rules.directory_problem("run_dir", str(blocker / "a" / "b"), "fix") == (
        f"run_dir={blocker / 'a' / 'b'} cannot be created: {blocker} is a file; fix")

"""A run directory the run cannot write or continue in is refused before launch, in one line
(`trainer/run_dir.py`): an entry of the other kind where the run writes (each rule alone), and
a log to continue whose lines before the last are not records; a last line cut short by a
killed rank is not a refusal."""

from __future__ import annotations

import json

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from trainer.entry.pipeline import prepare_run_dir
from trainer.run_dir import RUN_ENTRIES, entry_in_the_way, metrics_problem

TRAIN = json.dumps({"kind": "train", "step": 1, "loss": 5.0, "lr": 1e-3}) + "\n"


@pytest.mark.parametrize("name", list(RUN_ENTRIES))
def test_an_entry_of_the_other_kind_is_named_with_the_way_out(tmp_path, name):
    folder, what = RUN_ENTRIES[name]
    path = tmp_path / name
    if folder:
        path.write_text("")
    else:
        path.mkdir()
    kind, wanted = ("a file", "folder") if folder else ("a folder", "file")
    assert entry_in_the_way(tmp_path) == (
        f"{path} is {kind}, where the run keeps its {what} (a {wanted}); move it out of the run "
        "directory, or give the run another run_dir=")


def test_entries_of_their_own_kind_are_not_in_the_way(tmp_path):
    for name, (folder, _) in RUN_ENTRIES.items():
        (tmp_path / name).mkdir() if folder else (tmp_path / name).write_text("")
    assert entry_in_the_way(tmp_path) is None


@pytest.mark.parametrize(("text", "line"), [
    ((TRAIN + '{"kind": "tr\n' + TRAIN).encode(), "2 is not a metrics record (Unterminated string"),
    (b"\xff\n", "1 is not a metrics record (not UTF-8 text: byte 0xff at column 1)"),
    (TRAIN.encode() + b'{"kind": "train", "step": "x", "loss": 1, "lr": 1}\n',
     '2 is not a metrics record (step is "x", not a whole number 0 or more)'),
])
def test_a_damaged_log_before_its_last_line_is_refused(tmp_path, text, line):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(text)
    problem = metrics_problem(tmp_path)
    assert problem.startswith(f"{path}:{line}") and "\n" not in problem
    assert problem.endswith(f"; move {path} aside (the run starts a new log) or delete that "
                            "line, and run again")


def test_a_log_cut_short_in_its_last_line_is_continued(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(TRAIN + '{"kind": "train", "st')
    assert metrics_problem(tmp_path) is None
    assert metrics_problem(tmp_path / "none_yet") is None


def test_the_launching_process_refuses_before_it_writes_the_config(tmp_path):
    cfg = get_recipe("tiny_dp1")
    cfg.run_dir = str(tmp_path)
    (tmp_path / "checkpoints").write_text("")
    with pytest.raises(ConfigError, match="checkpoints is a file, where the run keeps its "
                                          "checkpoints"):
        prepare_run_dir(cfg, lock=True)
    assert not (tmp_path / "config.yaml").exists()

"""compare_runs.py on damaged or ambiguous input: every damaged metrics.jsonl line is one
`error:` line naming file and line (exit 2), a last line cut short by a killed run is skipped
with a note, a directory given twice is refused, and colliding folder names are told apart.
Each rule's pure function is fired alone; `main` shows the line a user sees."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from plugins.logging.curves import read_run
from plugins.protocol.errors import EXIT_USER_ERROR, ConfigError
from plugins.protocol.metrics_file import (
    is_cut_short,
    number_problem,
    parse_line,
    parse_metrics,
    phase_name_problem,
    record_problem,
    step_problem,
    tokens_problem,
)
from trainer.entry.commands import COMPARE_RUNS
from trainer.entry.contract import main
from trainer.tools.compare_runs import check_distinct, run_labels

PNG = b"\x89PNG\r\n\x1a\n"
TRAIN = {"kind": "train", "step": 1, "loss": 5.0, "lr": 1e-3, "phase_name": "run",
         "source_tokens": {"synthetic": 1024}}
HEAD = (json.dumps({"kind": "heldout", "step": 0, "loss": 6.0}) + "\n"
        + json.dumps(TRAIN) + "\n").encode()


def _run(run_dir: Path, tail: bytes = b"") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_bytes(HEAD + tail)
    return run_dir


def _refused(capsys, *args: str) -> str:
    assert main(COMPARE_RUNS, [*args, "out=unused.png"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# -- one rule each ---------------------------------------------------------------------------

def test_parse_line_names_bytes_that_are_not_utf8_and_json_that_does_not_parse():
    assert parse_line(b'{"a": 1}') == {"a": 1}
    assert math.isnan(parse_line(b'{"loss": NaN}')["loss"])
    with pytest.raises(ValueError, match="not UTF-8 text: byte 0xff at column 3"):
        parse_line(b'{"\xff": 1}')
    with pytest.raises(ValueError):
        parse_line(b'{"kind": "tr')


def test_record_problem_refuses_what_is_not_an_object():
    assert record_problem([1, 2, 3]) == "a JSON array, not an object"
    assert record_problem("text") == "a JSON string, not an object"
    assert record_problem(TRAIN) is None
    assert record_problem({"kind": "summary", "steps": "any"}) is None  # not drawn, not checked


def test_step_problem_wants_a_whole_number():
    assert step_problem({"step": 0}) is None
    assert step_problem({"step": "x"}) == 'step is "x", not a whole number 0 or more'
    assert step_problem({"step": 1.5}) == "step is 1.5, not a whole number 0 or more"
    assert step_problem({"step": True}) == "step is true, not a whole number 0 or more"
    assert step_problem({"step": -1}) == "step is -1, not a whole number 0 or more"
    assert step_problem({}) == "no step"


def test_number_problem_wants_a_number_and_keeps_nan():
    assert number_problem({"loss": 2}, "loss") is None
    assert number_problem({"loss": math.nan}, "loss") is None  # a diverged run writes NaN
    assert number_problem({"loss": math.inf}, "loss") is None
    assert number_problem({"loss": "abc"}, "loss") == 'loss is "abc", not a number'
    assert number_problem({"loss": None}, "loss") == "loss is null, not a number"
    assert number_problem({"lr": False}, "lr") == "lr is false, not a number"
    assert number_problem({}, "lr") == "no lr"
    assert number_problem({"loss": "x" * 100}, "loss").startswith('loss is "xxx')
    assert len(number_problem({"loss": "x" * 100}, "loss")) < 70  # cut for one line


def test_phase_name_problem_wants_text():
    assert phase_name_problem({"phase_name": "run"}) is None and phase_name_problem({}) is None
    assert phase_name_problem({"phase_name": [1]}) == "phase_name is [1], not text"


def test_tokens_problem_wants_counts_with_a_sum():
    assert tokens_problem({"source_tokens": {"a": 0, "b": 5}}) is None
    assert tokens_problem({}) is None and tokens_problem({"source_tokens": {}}) is None
    for bad in ({"a": 0}, {"a": "5"}, {"a": -1}, [5]):
        assert "not a map of sources to token counts" in tokens_problem({"source_tokens": bad})


def test_is_cut_short_only_for_the_last_line_without_its_newline():
    assert is_cut_short(3, 3, whole=False)
    assert not is_cut_short(3, 3, whole=True) and not is_cut_short(2, 3, whole=False)


def test_check_distinct_refuses_one_directory_given_twice(tmp_path):
    (tmp_path / "a").mkdir()
    check_distinct([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(ConfigError, match=r"^(\S+/a) is given twice \(again as \1/\.\./a/\); "
                                          "give each run directory once$"):
        check_distinct([str(tmp_path / "a"), f"{tmp_path / 'a'}/../a/"])


def test_run_labels_use_the_shortest_distinguishing_suffix():
    assert run_labels(["runs/a", "runs/b"]) == ["a", "b"]
    assert run_labels(["sweepA/G1", "sweepB/G1", "runs/G2"]) == ["sweepA/G1", "sweepB/G1", "G2"]
    assert run_labels(["x/s/G1", "y/s/G1"]) == ["x/s/G1", "y/s/G1"]


# -- the file as a whole ---------------------------------------------------------------------

def test_parse_metrics_skips_a_cut_last_line_with_a_note():
    records, note = parse_metrics(Path("r/metrics.jsonl"), HEAD + b'{"kind": "train", "st')
    assert len(records) == 2 and note == (
        "note: r/metrics.jsonl: its last line is cut short (a run stopped mid-write); "
        "compared without it")
    assert parse_metrics(Path("r/metrics.jsonl"), HEAD)[1] is None


def test_parse_metrics_refuses_a_cut_line_in_the_middle():
    with pytest.raises(ConfigError, match=r"^r/metrics.jsonl:3 is not a metrics record \("):
        parse_metrics(Path("r/metrics.jsonl"), HEAD + b'{"kind": "tr\n' + HEAD)


def test_parse_metrics_refuses_a_bad_last_line_that_ends_with_its_newline():
    with pytest.raises(ConfigError, match=r"metrics.jsonl:3 is not a metrics record"):
        parse_metrics(Path("r/metrics.jsonl"), HEAD + b'{"kind": "tr\n')


def test_read_run_labels_the_curves_and_keeps_nan_losses(tmp_path):
    nan = json.dumps({**TRAIN, "step": 2, "loss": math.nan}).encode() + b"\n"
    curves = read_run(_run(tmp_path / "a", nan), "sweepA/a")
    assert curves.name == "sweepA/a" and curves.train_loss[0] == (1, 5.0)
    assert math.isnan(curves.train_loss[1][1])  # drawn as a gap (plot_curves leaves it out)


@pytest.mark.parametrize("line, reason", [
    (b"[1,2,3]", "a JSON array, not an object"),
    (b'{"kind": "train", "step": 2, "loss": "abc", "lr": 1e-3}', 'loss is "abc", not a number'),
    (b'{"kind": "heldout", "step": 2, "loss": null}', "loss is null, not a number"),
    (b'{"kind": "heldout", "step": 2, "loss": \xff}', "not UTF-8 text: byte 0xff at column 40"),
    (b'{"kind": "heldout", "step": "x", "loss": 1.0}', 'step is "x", not a whole number'),
])
def test_a_damaged_line_is_one_error_line(tmp_path, monkeypatch, capsys, line, reason):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "a", line + b"\n")
    err = _refused(capsys, "a")
    assert err.startswith(f"error: a/metrics.jsonl:3 is not a metrics record ({reason}")


def test_a_run_killed_mid_write_is_compared_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "a", b'{"kind": "train", "step": 2, "lo')
    assert main(COMPARE_RUNS, ["a", "out=a.png"]) == 0
    assert capsys.readouterr().err == (
        "note: a/metrics.jsonl: its last line is cut short (a run stopped mid-write); "
        "compared without it\n")
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)


def test_the_same_run_twice_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "G1")
    assert _refused(capsys, "G1", "./G1/") == (
        "error: G1 is given twice (again as ./G1/); give each run directory once\n")


def test_two_sweeps_g1_runs_are_told_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "sweepA" / "G1"), _run(tmp_path / "sweepB" / "G1")
    seen = []
    monkeypatch.setattr("trainer.tools.compare_runs.plot_curves",
                        lambda runs, path, title: seen.append(title) or path)
    assert main(COMPARE_RUNS, ["sweepA/G1", "sweepB/G1", "out=g.png"]) == 0
    assert seen == ["sweepA/G1 vs sweepB/G1"]


def test_a_disk_that_fills_while_the_picture_is_written_leaves_none(tmp_path, monkeypatch,
                                                                    capsys):
    """Before: an OSError traceback, and the PNG left half written under its name."""
    import errno
    import os

    from plugins.logging import curves

    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "a")
    (tmp_path / "a.png").write_bytes(b"an older picture")

    def full(source, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(curves.os, "replace", full)
    assert main(COMPARE_RUNS, ["a", "out=a.png"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (
        "error: out=a.png could not be written (No space left on device); free space there, or "
        "name a .png file on another file system\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "a.png"]
    assert (tmp_path / "a.png").read_bytes() == b"an older picture"

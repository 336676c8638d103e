"""The tokenizer a preparation writes with is refused in one line when its end of document is
wrong (an ordinary word named as eod_token=, a configured eos token the tokenizer lacks, a
damaged tokenizer_config.json), and its training shows a bar on a terminal only."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from tokenizers import AddedToken, Tokenizer, models

from data_prep.config import PrepareConfig
from data_prep.hf_tokenizer import (
    configured_eos,
    counted,
    missing_eos_problem,
    ordinary_eod_problem,
    prepare_tokenizer,
    read_tokenizer_config,
    train_byte_level_bpe,
    trained_eod_problem,
    training_bar,
    unknown_eod_problem,
)
from plugins.protocol.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
WORDS = {"[UNK]": 0, "the": 1, "cat": 2, "</s>": 3}


def word_tokenizer(special: str | None = "<|endoftext|>") -> Tokenizer:
    """A word-level tokenizer holding `the` as an ordinary token and `special` as an added
    special one."""
    tokenizer = Tokenizer(models.WordLevel(dict(WORDS), unk_token="[UNK]"))
    if special:
        tokenizer.add_special_tokens([AddedToken(special, special=True, normalized=False)])
    return tokenizer


def folder(tmp_path: Path, config: str | None) -> Path:
    """A tokenizer folder with a tokenizer_config.json of text `config` (none for None)."""
    path = tmp_path / "tok"
    path.mkdir(exist_ok=True)
    word_tokenizer().save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(config)
    return path


def cfg(tokenizer: str = "tok", **changes) -> PrepareConfig:
    return PrepareConfig(input="x", output="y", tokenizer=tokenizer, **changes)


def test_an_ordinary_word_as_eod_token_is_refused():
    problem = ordinary_eod_problem(word_tokenizer(), cfg(eod_token="the"), None)
    assert problem == (
        "eod_token=the is an ordinary token of tokenizer=tok (id 1), not a special one: every "
        "'the' in the text would end a document; name one of its special tokens "
        "(<|endoftext|>), or leave eod_token unset")


def test_an_ordinary_eod_token_with_no_special_tokens_says_how_to_add_one():
    problem = ordinary_eod_problem(word_tokenizer(None), cfg(eod_token="cat"), None)
    assert problem is not None
    assert "add an end-of-document token to its tokenizer.json's added_tokens" in problem


def test_a_special_token_or_a_known_end_of_text_spelling_is_accepted():
    assert ordinary_eod_problem(word_tokenizer(), cfg(eod_token="<|endoftext|>"), None) is None
    assert ordinary_eod_problem(word_tokenizer(), cfg(eod_token="</s>"), None) is None  # plain
    assert ordinary_eod_problem(word_tokenizer(), cfg(), None) is None  # eod_token unset


def test_an_eod_token_the_tokenizer_lacks_is_refused():
    problem = unknown_eod_problem(word_tokenizer(), cfg(eod_token="<nope>"))
    assert problem is not None and problem.startswith("eod_token=<nope> is not a token of ")
    assert unknown_eod_problem(word_tokenizer(), cfg(eod_token="the")) is None


def test_eod_token_with_a_trained_tokenizer_must_be_its_own():
    problem = trained_eod_problem(cfg("train:300", eod_token="</s>"))
    assert problem is not None and "leave eod_token unset" in problem
    assert trained_eod_problem(cfg("train:300", eod_token="<|endoftext|>")) is None
    assert trained_eod_problem(cfg("train:300")) is None


def test_a_damaged_tokenizer_config_is_one_line(tmp_path):
    problem = read_tokenizer_config(str(folder(tmp_path, "{bad")))
    assert isinstance(problem, str) and "\n" not in problem
    assert "tokenizer_config.json cannot be read (Expecting property name" in problem
    assert problem.endswith("download it again or fix it (or remove it: the tokenizer's own "
                            "end-of-text token is used then)")


def test_a_tokenizer_config_that_is_not_an_object_is_refused(tmp_path):
    problem = read_tokenizer_config(str(folder(tmp_path, "[1, 2]")))
    assert isinstance(problem, str) and "holds list, not a JSON object" in problem


def test_a_readable_or_absent_tokenizer_config(tmp_path):
    assert read_tokenizer_config(str(folder(tmp_path, None))) is None
    path = folder(tmp_path, json.dumps({"eos_token": {"content": "</s>", "special": True}}))
    assert configured_eos(read_tokenizer_config(str(path))) == "</s>"
    assert read_tokenizer_config(str(path / "tokenizer.json")) == {  # beside the file too
        "eos_token": {"content": "</s>", "special": True}}


def test_a_configured_eos_the_tokenizer_lacks_is_refused():
    problem = missing_eos_problem(word_tokenizer(), "tok", "<eos>")
    assert problem == (
        "tokenizer=tok: its tokenizer_config.json names eos_token <eos>, which its "
        "tokenizer.json does not hold (its special tokens: <|endoftext|>); fix eos_token in "
        "tokenizer_config.json, or name the end of a document with eod_token=<token>")
    assert missing_eos_problem(word_tokenizer(), "tok", "</s>") is None
    assert missing_eos_problem(word_tokenizer(), "tok", None) is None


@pytest.mark.parametrize(("config", "changes", "expected"), [
    ("{bad", {}, "tokenizer_config.json cannot be read"),
    ('{"eos_token": "<eos>"}', {}, "names eos_token <eos>, which its tokenizer.json"),
    (None, {"eod_token": "the"}, "eod_token=the is an ordinary token"),
])
def test_prepare_tokenizer_refuses_before_any_reading(tmp_path, config, changes, expected):
    with pytest.raises(ConfigError, match=expected):
        prepare_tokenizer(cfg(str(folder(tmp_path, config)), **changes))


def test_an_eos_the_tokenizer_lacks_is_no_refusal_when_eod_token_names_one(tmp_path):
    path = folder(tmp_path, '{"eos_token": "<eos>"}')
    assert prepare_tokenizer(cfg(str(path), eod_token="<|endoftext|>")).eod_id == 4


def test_the_script_refuses_a_damaged_tokenizer_config_in_one_line(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("the cat\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prepare_data.py"), f"input={text}",
         f"output={tmp_path / 'out'}", f"tokenizer={folder(tmp_path, '{bad')}"],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tokenizer=")
    assert "Traceback" not in done.stdout + done.stderr


def test_counted_passes_the_texts_on_and_counts_them():
    console = Console(file=io.StringIO())
    with training_bar(False, console) as bar:
        task = bar.add_task("tokenizer", total=None, documents=0, phase="reading")
        items = list(counted([["ab", "c"], "é" * 2**19], bar, task))
        state = next(t for t in bar.tasks if t.id == task)
    assert items == [["ab", "c"], "é" * 2**19]
    assert (state.fields["documents"], state.fields["phase"]) == (3, "merging")
    assert state.completed == pytest.approx((3 + 2**20) / 2**20)  # MiB of UTF-8 text


def test_training_shows_a_bar_on_a_terminal_only():
    texts = [["the cat sat on the mat"] * 50]
    quiet = Console(file=io.StringIO())  # not a terminal: logs, tests, pipes
    train_byte_level_bpe(texts, 300, progress=None, console=quiet)
    assert quiet.file.getvalue() == ""
    shown = Console(file=io.StringIO(), force_terminal=True, width=100)
    trained = train_byte_level_bpe(texts, 300, progress=None, console=shown)
    output = shown.file.getvalue()
    assert "tokenizer" in output and "MiB of text, 50 documents" in output and "trained" in output
    assert trained.token_to_id("<|endoftext|>") == 0

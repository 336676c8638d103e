"""Blend mistakes refused in one line before any work: `valid:` beside `split:` (the split would
be ignored), and `prepare:` entries (their keys, through prepare_data's parser, and their
outputs against the manifests the blend names) before any entry prepares its data."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from data_prep import blend_prepare
from data_prep.blend_prepare import (
    check_prepare_entries,
    entry_key_problem,
    prepare_missing_data,
)
from data_prep.blend_prepare import prepare_problems as all_prepare_problems
from plugins.protocol.errors import ConfigError, ConfigErrors
from recipes.config.blend import (
    load_blend,
    made_manifests,
    makes,
    prepare_list_problem,
    prepare_output_problem,
    prepare_problems,
    unprepared_problem,
    valid_with_split_problem,
)


def write(folder: Path, text: str, name: str = "blend.yaml") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def run_config(*blends: str) -> SimpleNamespace:
    """What the preparation reads of a run's config: its data source, blend and phases."""
    return SimpleNamespace(data=SimpleNamespace(source="blend", blend=blends[0]),
                           phases=[SimpleNamespace(blend=b) for b in blends[1:]])


# --- valid: beside split: --------------------------------------------------------------------

def test_valid_sources_beside_a_split_are_refused():
    loaded = {"train": [{"manifest": "a.json"}], "valid": [{"manifest": "b.json"}],
              "split": [95, 5]}
    assert valid_with_split_problem(loaded) == (
        "names both valid: sources and split: [95, 5]; the split divides the train sources into "
        "train and held-out samples, which the valid: sources replace (the split would be "
        "ignored); keep one: remove split:, or remove valid:")


def test_valid_or_split_alone_is_accepted():
    assert valid_with_split_problem({"train": [], "valid": [{"manifest": "b.json"}]}) is None
    assert valid_with_split_problem({"train": [], "split": [95, 5]}) is None


def test_load_blend_refuses_valid_with_split_before_reading_any_dataset(tmp_path):
    path = write(tmp_path, "train: [{manifest: absent.json}]\nvalid: [{manifest: absent.json}]\n"
                           "split: [95, 5]\n")
    with pytest.raises(ConfigError) as error:
        load_blend(path)
    assert str(error.value).startswith(f"data.blend={path}: names both valid: sources and split:")


# --- prepare: entries, the blend's own rules -------------------------------------------------

def test_a_prepare_list_of_other_shapes_is_refused():
    assert prepare_list_problem(None) is None and prepare_list_problem([{"a": 1}]) is None
    assert prepare_list_problem({"input": "x"}).startswith("'prepare' must be a list of")
    assert prepare_list_problem(["input=x"]) is not None


def test_an_output_makes_its_manifest_and_its_datasets(tmp_path):
    assert makes(f"{tmp_path}/q", f"{tmp_path}/q.json")
    assert makes(f"{tmp_path}/q", f"{tmp_path}/x/../q_train_00000")
    assert not makes(f"{tmp_path}/qq", f"{tmp_path}/q.json")
    assert not makes(f"{tmp_path}/q", f"{tmp_path}/qq_part0")


def test_an_output_the_blend_does_not_name_is_refused():
    problem = prepare_output_problem(0, {"output": "o/qq", "input": "c"}, ["o/q.json"])
    assert problem == (
        "prepare[0] (output=o/qq) makes o/qq.json, which its train:/valid: entries do not name "
        "(they name o/q.json); set the entry's output to the prefix of a manifest they name "
        "(<output>.json), or name its manifest in train:")
    assert prepare_output_problem(0, {"output": "o/q"}, ["o/q.json"]) is None
    assert prepare_output_problem(0, {"input": "c"}, ["o/q.json"]) is None  # the parser's


def test_the_blend_rules_list_every_entry_and_the_manifests_they_make(tmp_path):
    loaded = {"train": [{"manifest": f"{tmp_path}/q.json"}],
              "prepare": [{"output": f"{tmp_path}/q"}, {"output": f"{tmp_path}/r"}]}
    assert [p.split(" makes")[0] for p in prepare_problems(loaded)] == [
        f"prepare[1] (output={tmp_path}/r)"]
    assert made_manifests(loaded) == {tmp_path / "q.json", tmp_path / "r.json"}


def test_load_blend_says_a_manifest_its_prepare_list_makes_is_not_prepared_yet(tmp_path):
    path = write(tmp_path, f"train: [{{manifest: {tmp_path}/q.json}}]\nprepare:\n"
                           f"  - {{input: c, output: {tmp_path}/q, tokenizer: 'train:300'}}\n")
    with pytest.raises(ConfigError) as error:
        load_blend(path)
    assert str(error.value) == f"data.blend={path}: {unprepared_problem(f'{tmp_path}/q.json')}"
    assert "run scripts/prepare_data.py" not in str(error.value)


def test_load_blend_refuses_an_entry_whose_output_it_does_not_name(tmp_path):
    path = write(tmp_path, f"train: [{{manifest: {tmp_path}/q.json}}]\nprepare:\n"
                           f"  - {{input: c, output: {tmp_path}/qq, tokenizer: 'train:300'}}\n")
    with pytest.raises(ConfigError, match=r"prepare\[0\] \(output=.*/qq\) makes .*/qq.json, "
                                          "which its train:/valid: entries do not name"):
        load_blend(path)


# --- prepare: entries, prepare_data's keys ----------------------------------------------------

def test_a_misspelt_key_of_an_entry_is_named_with_the_closest_key():
    problem = entry_key_problem(1, {"input": "c", "output": "o/p", "tokenizer": "train:300",
                                    "num_shardz": 2})
    assert problem == ("prepare[1] (output=o/p): unknown key 'num_shardz'; did you mean "
                       "num_shards, shard_size?")
    assert entry_key_problem(0, {"input": "c", "output": "o/p", "tokenizer": "train:300"}) is None


def test_every_problem_of_every_entry_is_a_line_of_its_own(tmp_path):
    loaded = {"train": [{"manifest": "o/p.json"}],
              "prepare": [{"input": "c", "output": "o/p", "tokenizer": "t", "num_shardz": 2},
                          {"input": "c", "output": "o/q", "tokenizer": "t"}]}
    problems = all_prepare_problems("b.yaml", loaded)
    assert len(problems) == 2 and all(p.startswith("data.blend=b.yaml: prepare[") for p in problems)
    assert "unknown key 'num_shardz'" in problems[0] and "makes o/q.json" in problems[1]


def test_nothing_is_prepared_when_any_entry_is_wrong(tmp_path, monkeypatch):
    """The second entry's mistake stops the run before the first entry prepares anything."""
    prepared = []
    monkeypatch.setattr(blend_prepare, "_prepare", lambda *args: prepared.append(args))
    good = write(tmp_path, f"train: [{{manifest: {tmp_path}/p.json}}]\nprepare:\n"
                           f"  - {{input: c, output: {tmp_path}/p, tokenizer: 'train:300'}}\n",
                 "good.yaml")
    bad = write(tmp_path, f"train: [{{manifest: {tmp_path}/q.json}}]\nprepare:\n"
                          f"  - {{input: c, output: {tmp_path}/q, tokenizer: 'train:300', "
                          "num_shardz: 2}\n"
                          f"  - {{input: c, output: {tmp_path}/z, tokenizer: 'train:300'}}\n",
                "bad.yaml")
    with pytest.raises(ConfigErrors) as error:
        prepare_missing_data(run_config(good, bad))
    assert prepared == [] and len(error.value.messages) == 2
    assert check_prepare_entries(run_config(good, bad)) == error.value.messages[0]
    prepare_missing_data(run_config(good))
    assert [args[0]["output"] for args in prepared] == [f"{tmp_path}/p"]
    assert check_prepare_entries(run_config(good)) is None


def test_check_paths_names_a_misspelt_prepare_key(tmp_path):
    """`pretrain.py check=paths` prepares nothing, yet meets a prepare: entry's misspelt key
    (the pre-flight's path rules end with `check_prepare_entries`)."""
    from recipes.resolve import resolve_config
    from trainer.checkpoint.preflight import path_problems

    (tmp_path / "in.txt").write_text("hello\n")
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"prepare:\n  - {{input: {tmp_path}/in.txt, output: {tmp_path}/p, "
                     f"num_shardz: 2}}\ntrain:\n  - {{manifest: {tmp_path}/p.json}}\n")
    cfg = resolve_config(["recipe=tiny_dp1", "data.source=blend", f"data.blend={blend}"])
    assert any("prepare[0] (output=" in line and "unknown key 'num_shardz'; did you mean "
               "num_shards" in line for line in path_problems(cfg))


def test_a_blend_that_is_not_utf8_is_left_to_the_path_rules_by_what_only_looks_into_it(
        tmp_path, monkeypatch):
    """The preparation and the list of paths a container mounts read a blend only to look into
    it: bytes that are not UTF-8 are not theirs to refuse (the path rules name them in one
    line), so neither raises, and nothing is prepared."""
    from recipes.config.blend import named_paths

    prepared = []
    monkeypatch.setattr(blend_prepare, "_prepare", lambda *args: prepared.append(args))
    blend = tmp_path / "blend.yaml"
    blend.write_bytes(b"\xf1\x00garbage\xff")
    prepare_missing_data(run_config(str(blend)))
    assert prepared == [] and named_paths(str(blend)) == [str(blend)]
    with pytest.raises(ConfigError, match=r"blend.yaml is not UTF-8 text \(byte 0\); save it"):
        load_blend(str(blend))

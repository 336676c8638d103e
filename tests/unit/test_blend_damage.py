"""A blend file or the manifest it names, damaged or misspelt, is one line before launch: a
manifest whose shard lists are not lists of named shards (or list no train shard) would
otherwise crash blend loading with a TypeError or kill a rank; an unknown key in a blend would
be ignored without a word, so a misspelt `weight` or `valid` silently trains on another mix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from plugins.protocol.errors import ConfigError
from recipes.config.blend import load_blend


def _blend(tmp_path: Path, content: dict) -> str:
    path = tmp_path / "blend.yaml"
    path.write_text(yaml.safe_dump(content))
    return str(path)


def _manifest(tmp_path: Path, **changes) -> str:
    facts = {"eod_id": 1, "vocab_size": 5, "tokenizer": "x.tokenizer",
             "shards": [{"prefix": "x_a"}], "valid_shards": [], **changes}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(facts))
    return str(path)


@pytest.mark.parametrize("changes,detail", [
    ({"shards": 3}, r"its 'shards' is int, not a list of shards"),
    ({"shards": [{"prefix": None}]}, r"shards\[0\] has no 'prefix' name"),
    ({"shards": ["x_a"]}, r"shards\[0\] has no 'prefix' name"),
    ({"valid_shards": {"prefix": "x"}}, r"its 'valid_shards' is dict"),
    ({"shards": []}, r"its 'shards' list is empty"),
])
def test_a_damaged_manifest_is_one_line_before_launch(tmp_path, changes, detail) -> None:
    manifest = _manifest(tmp_path, **changes)
    with pytest.raises(ConfigError, match=rf"manifest {manifest} is not a prepare_data manifest "
                                          rf"\({detail}.*\); run scripts/prepare_data.py again"):
        load_blend(_blend(tmp_path, {"train": [{"manifest": manifest}]}))


@pytest.mark.parametrize("content,expected", [
    ({"train": [{"manifest": "M", "wieght": 5}]},
     r"unknown key 'wieght' in train entry .*; did you mean 'weight'\?"),
    ({"train": [{"manifest": "M", "weight": 1, "extra": 3}]},
     r"unknown key 'extra' in train entry .*; the keys are manifest, prefix, weight"),
    ({"train": [{"manifest": "M"}], "vaild": [{"manifest": "M"}]},
     r"unknown key 'vaild' in the blend; did you mean 'valid'\?"),
])
def test_an_unknown_key_in_a_blend_is_refused_with_the_closest(tmp_path, content,
                                                               expected) -> None:
    manifest = _manifest(tmp_path)
    content = json.loads(json.dumps(content).replace('"M"', json.dumps(manifest)))
    with pytest.raises(ConfigError, match=expected):
        load_blend(_blend(tmp_path, content))

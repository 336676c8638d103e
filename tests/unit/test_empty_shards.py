"""No preparation writes, and no blend launches on, a dataset with no tokens: its `.bin` is empty
and Megatron Core's reader dies on every rank with `cannot mmap an empty file`. A plan giving a
shard no input is refused before anything is written; a shard that found no document with text
before the manifest and `<output>.data-args` name it; a blend naming such a dataset (an older
preparation's) before launch.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from data_prep.config import PrepareConfig
from data_prep.prepare import prepare
from plugins.protocol.errors import ConfigError
from recipes.config.blend import load_blend
from tests.word_tokenizer import word_tokenizer

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def _prepare(tmp_path: Path, input_file: Path, **changes) -> None:
    prepare(PrepareConfig(input=str(input_file), output=str(tmp_path / "out" / "x"),
                          tokenizer=str(word_tokenizer(tmp_path)), **changes), progress=False)


def _three_lines(tmp_path: Path) -> Path:
    path = tmp_path / "three.txt"
    path.write_text("alpha beta\nbeta gamma\ngamma alpha\n")
    return path


def _written(tmp_path: Path) -> list[str]:
    folder = tmp_path / "out"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_one_compressed_file_in_four_shards_is_refused_before_writing(tmp_path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "alpha beta"}\n' * 50))
    with pytest.raises(ConfigError, match=r"num_shards=4 would leave 3 of 4 train shards with "
                                          r"no input .*give num_shards=1, or the corpus"):
        _prepare(tmp_path, path, num_shards=4)
    assert not [n for n in _written(tmp_path) if n.endswith((".bin", ".json", ".data-args"))]


def test_more_valid_shards_than_train_shards_is_refused_before_writing(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"valid_shards=3 would leave 1 of 3 valid shards .* "
                                          r"give valid_shards=2 or fewer"):
        _prepare(tmp_path, _three_lines(tmp_path), num_shards=2, valid_shards=3)
    assert not [n for n in _written(tmp_path) if n.endswith(".bin")]


def test_more_shards_than_lines_is_refused_before_the_manifest(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"x_train_\d+ would hold no tokens \(7 of 10 train "
                                          r"shards\): num_shards=10 cuts the source's 3 train "
                                          r"documents .* give num_shards=3$"):
        _prepare(tmp_path, _three_lines(tmp_path), num_shards=10)
    assert not {"x.json", "x.data-args"} & set(_written(tmp_path))


def test_a_held_out_shard_that_gets_no_document_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"x_valid_00000 would hold no tokens: "
                                          r"held_out_fraction=0.001 .* 3 documents"):
        _prepare(tmp_path, _three_lines(tmp_path), num_shards=1, valid_shards=1,
                 held_out_fraction=0.001)
    assert not {"x.json", "x.data-args"} & set(_written(tmp_path))


def _empty_dataset(prefix: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    builder.add_document(np.zeros(0, np.uint16), [])  # one empty document
    builder.finalize(f"{prefix}.idx")


def test_a_blend_naming_a_dataset_with_no_tokens_is_refused(tmp_path) -> None:
    _empty_dataset(tmp_path / "empty")
    blend = tmp_path / "blend.yaml"
    blend.write_text(yaml.safe_dump({"train": [{"prefix": str(tmp_path / "empty")}],
                                     "eod_id": 1, "vocab_size": 5}))
    with pytest.raises(ConfigError, match=r"empty.bin holds no tokens \(1 documents, none with "
                                          r"text\), which Megatron cannot read"):
        load_blend(str(blend))


def test_a_blend_naming_an_older_manifest_with_an_empty_shard_is_refused(tmp_path) -> None:
    _prepare(tmp_path, _three_lines(tmp_path))  # one dataset: out/x_three
    manifest = tmp_path / "out" / "x.json"
    facts = json.loads(manifest.read_text())
    _empty_dataset(tmp_path / "out" / "x_old")  # what an older run wrote, listed too
    facts["shards"].append({**facts["shards"][0], "prefix": "x_old"})
    manifest.write_text(json.dumps(facts))
    blend = tmp_path / "blend.yaml"
    blend.write_text(yaml.safe_dump({"train": [{"manifest": str(manifest)}]}))
    with pytest.raises(ConfigError, match=r"x_old.bin holds no tokens"):
        load_blend(str(blend))

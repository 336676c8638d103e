"""A re-run of a preparation keeps a shard only when its files are the ones its record describes,
token stream included, and redoes it when the record itself is damaged: a block of a `.bin`
overwritten in place (same size, untouched ends) must not be kept, and a record holding a JSON
string must not stop the re-run with a traceback. A damaged pack index, found by the rank that
opens it, names that re-run as the fix, and the re-run repairs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.config import PrepareConfig
from data_prep.prepare import prepare
from recipes.config import dataset_files
from tests.word_tokenizer import word_tokenizer

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def _cfg(tmp_path: Path) -> PrepareConfig:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{'alpha beta gamma ' * (i % 9 + 1)}\n" for i in range(400)))
    return PrepareConfig(input=str(corpus), output=str(tmp_path / "out" / "x"),
                         tokenizer=str(word_tokenizer(tmp_path)), num_shards=2)


def test_a_bin_damaged_in_its_middle_is_redone_by_the_rerun(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dataset_files, "SAMPLE_BYTES", 16)  # the ends' fingerprint misses it
    cfg = _cfg(tmp_path)
    prepare(cfg, progress=False)
    data = tmp_path / "out" / "x_train_00000.bin"
    good = data.read_bytes()
    middle = len(good) // 2
    data.write_bytes(good[:middle] + b"\xff" * 64 + good[middle + 64:])
    again = prepare(cfg, progress=False)
    assert again.redone == 1 and data.read_bytes() == good


def test_a_record_holding_a_json_string_is_redone(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    prepare(cfg, progress=False)
    record = tmp_path / "out" / "x.shards" / "x_train_00001.json"
    for damage in ('"x"', "3", '{"key": 1}', '{"datasets": ["a"]}'):
        record.write_text(damage)
        assert prepare(cfg, progress=False).redone == 1, damage
        assert isinstance(json.loads(record.read_text()), dict)


def test_a_damaged_pack_index_names_the_rerun_which_repairs_it(tmp_path) -> None:
    from data_prep.packing import PackIndex
    from plugins.protocol.errors import UserError

    cfg = _cfg(tmp_path)
    cfg.pack_size = 16
    prepare(cfg, progress=False)
    prefix = tmp_path / "out" / "x_train_00000"
    pieces = tmp_path / "out" / "x_train_00000.pack16.pieces.npy"
    pieces.write_bytes(pieces.read_bytes()[:100])
    with pytest.raises(UserError, match=r"is damaged: .*; re-run "
                                        r"scripts/prepare_data.py with the same arguments"):
        PackIndex(prefix, 16)
    prepare(cfg, progress=False)
    assert len(PackIndex(prefix, 16)) > 0

"""A pack index the trainer builds is seeded as `scripts/prepare_data.py` seeded the dataset's own
(its manifest records `seed=`), so deleting a damaged index, as the repair message offers, gives
back the index prepare_data wrote; a dataset no manifest lists is packed with `train.seed`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.config import PrepareConfig
from data_prep.packing import build_pack_index, pack_index_paths
from data_prep.prepare import prepare
from recipes.config.blend import preparation_seed
from tests.word_tokenizer import word_tokenizer
from trainer.data import pack_seed

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]
TRAIN_SEED = 1234


def _prepared(tmp_path: Path, seed: int) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{'alpha beta gamma ' * (i % 9 + 1)}\n" for i in range(400)))
    prepare(PrepareConfig(input=str(corpus), output=str(tmp_path / "out" / "x"), seed=seed,
                          tokenizer=str(word_tokenizer(tmp_path)), pack_size=16), progress=False)
    return tmp_path / "out" / "x_corpus"


def test_an_index_deleted_and_rebuilt_is_the_one_prepare_data_wrote(tmp_path):
    prefix = _prepared(tmp_path, seed=7)
    assert preparation_seed(str(prefix)) == 7
    assert pack_seed(str(prefix), TRAIN_SEED) == 7
    paths = pack_index_paths(prefix, 16)
    written = [path.read_bytes() for path in paths]
    for path in paths:
        path.unlink()
    build_pack_index(prefix, 16, seed=pack_seed(str(prefix), TRAIN_SEED))
    assert [path.read_bytes() for path in paths] == written
    build_pack_index(prefix, 16, seed=TRAIN_SEED)  # what the trainer built before
    assert [path.read_bytes() for path in paths] != written


def test_a_dataset_no_manifest_lists_is_packed_with_the_train_seed(tmp_path):
    prefix = _prepared(tmp_path, seed=7)
    (tmp_path / "out" / "x.json").unlink()
    assert preparation_seed(str(prefix)) is None
    assert pack_seed(str(prefix), TRAIN_SEED) == TRAIN_SEED


@pytest.mark.parametrize("seed", ["7", -1, True, None])
def test_a_manifest_seed_edited_to_a_non_seed_is_not_used(tmp_path, seed):
    prefix = _prepared(tmp_path, seed=7)
    manifest = tmp_path / "out" / "x.json"
    facts = json.loads(manifest.read_text())
    facts["settings"]["seed"] = seed
    manifest.write_text(json.dumps(facts))
    assert pack_seed(str(prefix), TRAIN_SEED) == TRAIN_SEED


def test_a_manifest_entry_gives_its_seed_without_a_look_around(tmp_path):
    """The blend's manifest entry names the manifest: every shard's seed at one look (a folder
    of 5,000 shards took 14 s by looking for the manifest beside each, 0.09 s this way)."""
    prefix = _prepared(tmp_path, seed=7)
    manifest = tmp_path / "out" / "x.json"
    moved = tmp_path / "elsewhere.json"
    manifest.rename(moved)  # not beside the dataset any more: only the named one is read
    assert pack_seed(str(prefix), TRAIN_SEED) == TRAIN_SEED
    assert pack_seed(str(prefix), TRAIN_SEED, str(moved)) == 7
    assert pack_seed(str(prefix), TRAIN_SEED, str(tmp_path / "gone.json")) == TRAIN_SEED


def test_pack_index_jsons_beside_the_datasets_are_not_read_as_manifests(tmp_path, monkeypatch):
    prefix = _prepared(tmp_path, seed=7)
    (tmp_path / "out" / "x.json").rename(tmp_path / "out" / "z.json")  # sorted after them
    read = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *args, **kwargs: read.append(self.name) or real(self, *args,
                                                                                     **kwargs))
    assert preparation_seed(str(prefix)) == 7
    assert not [name for name in read if ".pack" in name], read


@pytest.mark.parametrize("multiple", [1, 4])
def test_the_pack_index_json_pattern_is_the_name_the_packer_writes(multiple):
    from recipes.config.dataset_files import PACK_INDEX_JSON

    assert PACK_INDEX_JSON.search(pack_index_paths("d/x_train_00000", 4096, multiple)[2].name)
    assert not PACK_INDEX_JSON.search("x.json") and not PACK_INDEX_JSON.search("x.pack.json")


def test_a_folder_of_many_prefixes_is_listed_once_and_a_fresh_change_is_seen(tmp_path,
                                                                              monkeypatch):
    """A blend of N bare prefixes in one folder looked beside each of them: the folder is
    listed once per version, not N times (5,000 prefixes, 25,000 files: 82 s before, 0.1 s);
    a folder changed within RECENT_NS is listed again, so a manifest written in the same
    mtime tick as the last listing is still found."""
    import os
    import time

    from recipes.config import blend

    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(20):
        (folder / f"web_{i:02d}.idx").touch()
        (folder / f"web_{i:02d}.pack16.json").touch()  # pack index JSONs: passed over
    manifest = {"shards": [{"prefix": f"web_{i:02d}"} for i in range(20)],
                "settings": {"seed": 5}}
    (folder / "web.json").write_text(json.dumps(manifest))
    listed, real = [], os.listdir
    monkeypatch.setattr(blend.os, "listdir", lambda path: listed.append(path) or real(path))
    past = time.time() - 60
    os.utime(folder, (past, past))
    assert [preparation_seed(str(folder / f"web_{i:02d}")) for i in range(20)] == [5] * 20
    assert len(listed) == 1
    recent = time.time()
    os.utime(folder, (recent, recent))
    assert preparation_seed(str(folder / "web_03")) == 5
    (folder / "web.json").unlink()
    (folder / "old.json").write_text(json.dumps({**manifest, "settings": {"seed": 6}}))
    os.utime(folder, (recent, recent))  # as a change within the last listing's tick leaves it
    assert preparation_seed(str(folder / "web_03")) == 6  # recent: listed again, not cached
    assert len(listed) == 3

"""The view of a manifest's shards end to end is the unsharded dataset, sequence by sequence.

One small dataset (empty documents among them, one at a shard's edge) is written whole and as
three shards cut at document boundaries, as `scripts/prepare_data.py num_shards=3` cuts them;
the view over the shards must read as Megatron's `IndexedDataset` of the whole, and a GPTDataset
built on it must draw the whole's samples.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from recipes.config.blend import manifest_dataset
from tests.unit.dataset_fixtures import write_dataset

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

from trainer.sharded_dataset import ShardedGPTDataset, ShardedIndexedDataset  # noqa: E402

EOD = 0
CUTS = (5, 9)  # shards: documents [0, 5), [5, 9), [9, 14)


def _documents() -> list[list[int]]:
    rng = np.random.default_rng(4)
    documents = [[*rng.integers(1, 200, size=int(n)).tolist(), EOD]
                 for n in rng.integers(3, 40, size=14)]
    documents[5] = []  # an empty document opens the second shard
    documents[8] = []  # and one closes it
    return documents


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[IndexedDataset, ShardedIndexedDataset, Path]:
    """(the whole, the view over its three shards, their manifest)."""
    folder = tmp_path_factory.mktemp("sharded")
    documents = _documents()
    whole = IndexedDataset(write_dataset(folder / "whole", documents))
    bounds = (0, *CUTS, len(documents))
    names = [f"web_train_{k:05d}" for k in range(3)]
    for name, low, high in zip(names, bounds[:-1], bounds[1:], strict=True):
        write_dataset(folder / name, documents[low:high])
    valid = write_dataset(folder / "web_valid_00000", [[7, 8, EOD]])
    manifest = folder / "web.json"
    manifest.write_text(json.dumps({
        "eod_id": EOD, "vocab_size": 256,
        "shards": [{"prefix": name, "tokens": 1} for name in names],
        "valid_shards": [{"prefix": Path(valid).name, "tokens": 3}]}))
    view = ShardedIndexedDataset(str(folder / "web"),
                                 [IndexedDataset(str(folder / name)) for name in names])
    return whole, view, manifest


def test_the_view_has_the_whole_datasets_lengths_and_documents(made) -> None:
    whole, view, _ = made
    assert len(view) == len(whole) == 12  # 14 documents, two of them empty
    assert view.sequence_lengths.dtype == np.int32  # GPTDataset asserts it
    assert view.sequence_lengths.tolist() == whole.sequence_lengths.tolist()
    assert view.document_indices.tolist() == whole.document_indices.tolist()
    assert view.starts.tolist() == [0, 5, 7, 12]


def test_the_view_reads_every_sequence_as_the_whole_does(made) -> None:
    """Document by document, whole and in parts (GPTDataset's `get(idx, offset, length)`)."""
    whole, view, _ = made
    for index in range(len(whole)):
        assert view[index].tolist() == whole[index].tolist()
        assert view.get(index).tolist() == whole.get(index).tolist()
        size = int(whole.sequence_lengths[index])
        for offset, length in ((1, None), (0, 2), (size - 2, 2)):
            assert view.get(index, offset, length).tolist() == whole.get(
                index, offset, length).tolist(), (index, offset, length)


def test_reads_across_a_shard_boundary(made) -> None:
    whole, view, _ = made
    assert view.locate(4) == (0, 4) and view.locate(5) == (1, 0) and view.locate(7) == (2, 0)
    assert view.get(5, 1, 3).tolist() == whole.get(5, 1, 3).tolist()  # first of shard 1
    assert [s.tolist() for s in view[3:9]] == [s.tolist() for s in whole[3:9]]
    assert [s.tolist() for s in view[:]] == [s.tolist() for s in whole[:]]
    assert view[-1].tolist() == whole[-1].tolist()
    with pytest.raises(IndexError):
        view.get(len(view))
    with pytest.raises(ValueError, match="contiguous"):
        view[0:6:2]


def test_a_manifest_path_builds_the_view_and_a_prefix_its_dataset(made) -> None:
    whole, _, manifest = made
    config = _config(manifest.parent)
    train = ShardedGPTDataset.build_low_level_dataset(manifest_dataset(str(manifest), "train"),
                                                      config)
    assert isinstance(train, ShardedIndexedDataset) and len(train.shards) == 3
    assert train.path_prefix == str(manifest.with_suffix(""))
    assert [train[i].tolist() for i in range(len(train))] == [
        whole[i].tolist() for i in range(len(whole))]
    valid = ShardedGPTDataset.build_low_level_dataset(manifest_dataset(str(manifest), "valid"),
                                                      config)
    assert [valid[i].tolist() for i in range(len(valid))] == [[7, 8, EOD]]
    plain = ShardedGPTDataset.build_low_level_dataset(whole.path_prefix, config)
    assert isinstance(plain, IndexedDataset)
    assert ShardedGPTDataset.numel_low_level_dataset(train) == len(whole)


class _Tokenizer:
    eod, vocab_size, unique_identifiers = EOD, 256, {"eod": EOD}


def _config(cache: Path):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return GPTDatasetConfig(random_seed=5, sequence_length=16, split="1,0,0",
                            blend=(["unused"], None), path_to_cache=str(cache / "index"),
                            tokenizer=_Tokenizer(), reset_position_ids=False,
                            reset_attention_mask=False, eod_mask_loss=True,
                            create_attention_mask=False)


def test_a_gpt_dataset_on_the_view_draws_the_whole_datasets_samples(made, tmp_path) -> None:
    """Over three epochs (documents shuffled across shards): the same tokens, sample by
    sample."""
    from megatron.core.datasets.utils import Split

    whole, view, _ = made
    indices = np.arange(len(whole), dtype=np.int32)
    drawn = []
    for name, dataset in (("whole", whole), ("view", view)):
        gpt = ShardedGPTDataset(dataset, name, indices, 60, Split.train, _config(tmp_path / name))
        drawn.append([gpt[i]["tokens"].tolist() for i in range(len(gpt))])
    assert len(drawn[0]) >= 60 and drawn[1] == drawn[0]

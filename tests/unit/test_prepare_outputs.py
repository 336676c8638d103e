"""What a preparation writes and what it leaves: a path in the way of a name it writes is refused
before any work, a damaged Parquet page is one line, a shard that would hold no tokens is refused
(before tokenizing on a small corpus) with a count that works, a refused run leaves no dataset,
earlier datasets a manifest no longer lists are named in a note, and the summary counts tasks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep import prepare as prepare_module
from data_prep.config import PrepareConfig
from data_prep.prepare import (
    already_complete,
    in_the_way,
    outputs_in_the_way_problem,
    prepare,
    sub_dataset_of,
)
from data_prep.readers import parquet_damaged
from data_prep.shards import contained_count, has_text
from plugins.protocol.errors import ConfigError
from tests.word_tokenizer import word_tokenizer

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def _cfg(tmp_path: Path, input_file: Path, name: str = "x", **changes) -> PrepareConfig:
    return PrepareConfig(input=str(input_file), output=str(tmp_path / "out" / name),
                         tokenizer=str(word_tokenizer(tmp_path)), **changes)


def _lines(tmp_path: Path, count: int = 3, name: str = "three.txt") -> Path:
    path = tmp_path / name
    words = ("alpha beta", "beta gamma", "gamma alpha")
    path.write_text("".join(words[i % 3] + "\n" for i in range(count)))
    return path


def _written(tmp_path: Path) -> list[str]:
    folder = tmp_path / "out"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# ----------------------------------------------------------------------------- pure rules


def test_in_the_way_names_a_folder_where_a_file_goes_and_a_file_where_a_folder_goes(
        tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    assert in_the_way(tmp_path / "d", folder=False) == f"{tmp_path / 'd'} is a folder in the way"
    assert in_the_way(tmp_path / "f", folder=True) == f"{tmp_path / 'f'} is a file in the way"
    assert in_the_way(tmp_path / "d", folder=True) is None
    assert in_the_way(tmp_path / "f", folder=False) is None
    assert in_the_way(tmp_path / "none", folder=True) is None


def test_sub_dataset_of_knows_the_names_shard_size_gives() -> None:
    assert sub_dataset_of("x_a_00003", {"x_a"})
    assert not sub_dataset_of("x_a_3", {"x_a"})
    assert not sub_dataset_of("x_b_00003", {"x_a"})


def test_already_complete_counts_tasks_not_datasets() -> None:
    assert already_complete(tasks=3, redone=3) == 0  # 9 datasets written by 3 tasks, fresh
    assert already_complete(tasks=3, redone=1) == 2


def test_has_text_follows_the_encoders_rule() -> None:
    assert has_text(" ", keep_empty=True) and not has_text(" ", keep_empty=False)
    assert not has_text("", keep_empty=True) and not has_text(None, keep_empty=True)


def test_contained_count_is_a_count_every_range_of_which_holds_a_full_one() -> None:
    # 33 bytes, 10 ranges; ranges 0, 3 and 6 held a line start (bytes 0, 11, 22)
    full = [j in (0, 3, 6) for j in range(10)]
    best = contained_count(33, 10, full)
    starts = (0, 11, 22)
    assert best >= 1
    assert all(any(33 * j // best <= s < 33 * (j + 1) // best for s in starts)
               for j in range(best))


def test_parquet_damaged_names_the_file_and_row_group() -> None:
    line = str(parquet_damaged("d.parquet", 2, OSError("Corrupt snappy compressed data.")))
    assert line == ("input file d.parquet is damaged (OSError: Corrupt snappy compressed data.) "
                    "in row group 2; download or write it again, or remove it from input=")


# ----------------------------------------------------------------------------- in the way


@pytest.mark.parametrize(("make", "kind", "changes"), [
    ("x.shards", "file", {}),
    ("x.tokenizer", "file", {}),
    (".x.work", "file", {}),
    ("x.json", "folder", {}),
    ("x_three.bin", "folder", {}),
    ("x_train_00000.pack128.json", "folder", {"num_shards": 1, "pack_size": 128}),
    ("x_three_00002.idx", "folder", {"shard_size": 1}),
])
def test_a_path_in_the_way_is_refused_before_any_work(tmp_path, make, kind, changes) -> None:
    out = tmp_path / "out"
    out.mkdir()
    if kind == "file":
        (out / make).write_text("mine")
    else:
        (out / make).mkdir()
    cfg = _cfg(tmp_path, _lines(tmp_path), **changes)
    with pytest.raises(ConfigError) as caught:
        prepare(cfg, progress=False)
    assert str(caught.value) == (f"output={cfg.output}: {out / make} is a {kind} in the way; "
                                 "remove it or choose another output")
    assert _written(tmp_path) == [make]


def test_nothing_in_the_way_passes(tmp_path) -> None:
    cfg = _cfg(tmp_path, _lines(tmp_path))
    assert outputs_in_the_way_problem(cfg, [Path(cfg.input)]) is None


# ----------------------------------------------------------------------------- empty shards


def test_too_many_shards_is_refused_before_tokenizing_and_the_advice_works(tmp_path,
                                                                           monkeypatch) -> None:
    lines = _lines(tmp_path, name="t.txt")
    monkeypatch.setattr(prepare_module, "write_all", _no_writing)
    with pytest.raises(ConfigError, match=r"x_train_00001 would hold no tokens \(7 of 10 "
                                          r"train shards\): .* give num_shards=(\d+)$") as caught:
        prepare(_cfg(tmp_path, lines, num_shards=10), progress=False)
    assert [n for n in _written(tmp_path) if not n.startswith(".")] == []
    advised = int(str(caught.value).rsplit("=", 1)[1])
    monkeypatch.undo()
    result = prepare(_cfg(tmp_path, lines, num_shards=advised), progress=False)
    assert len(result.shards) == advised and all(s.tokens for s in result.shards)


def _no_writing(*args, **kwargs):
    raise AssertionError("refused before any shard was written")


def test_many_shards_over_many_documents_are_refused_before_writing(tmp_path,
                                                                    monkeypatch) -> None:
    monkeypatch.setattr(prepare_module, "write_all", _no_writing)
    with pytest.raises(ConfigError, match=r"give num_shards=\d+$"):
        prepare(_cfg(tmp_path, _lines(tmp_path, 1200), num_shards=5000), progress=False)


def test_a_tiny_held_out_share_is_refused_before_writing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(prepare_module, "write_all", _no_writing)
    with pytest.raises(ConfigError, match=r"x_valid_00000 would hold no tokens: held_out_"
                                          r"fraction=0.001 .* 3 documents .*raise held_out"):
        prepare(_cfg(tmp_path, _lines(tmp_path), num_shards=1, valid_shards=1,
                     held_out_fraction=0.001), progress=False)
    assert not [n for n in _written(tmp_path) if n.endswith(".bin")]


def test_a_shard_found_empty_after_writing_leaves_no_dataset(tmp_path, monkeypatch) -> None:
    """Past the small-corpus check (a large corpus is not read twice), the written shards of a
    refused run are removed, with a count that is sure to work."""
    monkeypatch.setattr(prepare_module, "small_corpus", lambda inputs: False)
    lines = _lines(tmp_path, name="t.txt")
    with pytest.raises(ConfigError, match=r"give num_shards=(\d+); no manifest was written; "
                                          r"its datasets were removed$") as caught:
        prepare(_cfg(tmp_path, lines, num_shards=10), progress=False)
    assert _written(tmp_path) == []
    advised = int(str(caught.value).split("give num_shards=")[1].split(";")[0])
    result = prepare(_cfg(tmp_path, lines, num_shards=advised), progress=False)
    assert all(s.tokens for s in result.shards)


def test_a_parquet_file_of_nulls_is_refused_before_writing(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": pa.array([None] * 2000, pa.string())}), path)
    with pytest.raises(ConfigError, match=r"x_nulls would hold no tokens \(1 of 1 train "
                                          r"shards\): input file .*nulls.parquet has no "
                                          r"document with text; remove it from input="):
        prepare(_cfg(tmp_path, path), progress=False)
    assert _written(tmp_path) == []


# ----------------------------------------------------------------------------- earlier runs


def test_earlier_datasets_the_manifest_no_longer_lists_are_named_not_deleted(tmp_path) -> None:
    lines = _lines(tmp_path, 30)
    prepare(_cfg(tmp_path, lines, num_shards=3), progress=False)
    result = prepare(_cfg(tmp_path, lines, num_shards=2), progress=False)
    assert result.earlier == ("x_train_00002",)
    assert prepare_module.earlier_note(result) == (
        f"note: output={tmp_path / 'out' / 'x'}: 1 earlier datasets not in this manifest "
        "(x_train_00002); delete them")
    assert (tmp_path / "out" / "x_train_00002.bin").is_file()


def test_the_summary_counts_complete_tasks_not_datasets(tmp_path) -> None:
    lines = _lines(tmp_path, 9)
    result = prepare(_cfg(tmp_path, lines, shard_size=3), progress=False)
    assert len(result.shards) == 3 and result.redone == 1 and result.tasks == 1
    assert "already complete" not in prepare_module.summary_line(result)

"""Inputs read as streams (`data_prep/readers.py`): byte ranges cut anywhere give every line of a
JSONL or text file exactly once, a Parquet file's row ranges its rows, and each compression the
same documents as the plain file; the plan of a sharded preparation depends only on the sizes.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep import readers
from data_prep.shards import plan_shards

ROWS = [{"text": "first"}, {"text": ""}, {"id": 3}, {"text": None}, {"text": "déjà vu\nx"},
        {"text": "a" * 3000}, {"text": "   "},
        *({"text": f"row {i} " * (i % 7)} for i in range(300))]


def _jsonl(folder: Path) -> Path:
    lines = [json.dumps(r) for r in ROWS]
    lines[4] += "\r"  # a CRLF line
    lines.insert(7, "   ")  # a blank line is no row
    path = folder / "rows.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    return path


def _expected() -> list[str | None]:
    return [r.get("text") for r in ROWS]


def _source(path: Path, fmt: str = "json", compression: str | None = None,
            sample_by: str = "line") -> readers.InputFile:
    return readers.inspect(path, fmt, compression, "text", sample_by)


def _ranges(source: readers.InputFile, cuts: list[int]) -> list[str | None]:
    bounds = [0, *sorted(cuts), source.units]
    return [d for a, b in zip(bounds, bounds[1:], strict=False)
            for d in readers.documents(source, a, b)]


def test_byte_ranges_cut_anywhere_give_every_line_once(tmp_path) -> None:
    source = _source(_jsonl(tmp_path))
    assert source.units == source.size and list(readers.documents(source)) == _expected()
    rng = random.Random(0)
    text = Path(source.path).read_bytes()
    newline = text.index(b"\n") + 1  # a cut just after a line break, one just before
    for cuts in ([newline, newline - 1], [1], [source.size - 1],
                 *(rng.sample(range(1, source.size), 9) for _ in range(20))):
        assert _ranges(source, cuts) == _expected(), cuts


def test_text_lines_split_on_universal_newlines(tmp_path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"one\r\ntwo\rthree\n\n   \nlast")
    source = _source(path, "text")
    expected = ["one", "two", "three", "", "   ", "last"]
    assert list(readers.documents(source)) == expected
    assert _ranges(source, [2, 5, 9, 14]) == expected
    assert list(readers.documents(_source(path, "text", sample_by="paragraph"))) == [
        "one\ntwo\nthree", "   \nlast"]


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
def test_every_compression_streams_the_same_documents(tmp_path, suffix) -> None:
    plain = _jsonl(tmp_path).read_bytes()
    path = tmp_path / f"rows.jsonl{suffix}"
    if suffix == ".zst":
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(plain)
    else:
        path.write_bytes({".gz": gzip, ".bz2": bz2, ".xz": lzma}[suffix].compress(plain))
    source = _source(path, compression=suffix)
    assert not source.splittable  # one range: a stream cannot be entered in the middle
    assert list(readers.documents(source)) == _expected()


def test_parquet_row_ranges_across_row_groups(tmp_path) -> None:
    path = tmp_path / "rows.parquet"
    texts = [f"doc {i}" if i % 9 else None for i in range(2500)]
    pq.write_table(pa.table({"n": list(range(2500)), "text": texts}), path, row_group_size=700)
    source = _source(path, "parquet")
    assert source.units == 2500 and list(readers.documents(source)) == texts
    assert _ranges(source, [1, 699, 700, 1401, 2000]) == texts


def test_the_plan_cuts_the_inputs_end_to_end_by_size(tmp_path) -> None:
    first = _source(_jsonl(tmp_path))
    gz = tmp_path / "more.jsonl.gz"
    gz.write_bytes(gzip.compress(Path(first.path).read_bytes()))
    second = _source(gz, compression=".gz")
    plans = plan_shards("o", ["rows", "more"], [first, second],
                        {"train": 3, "valid": 1}, 20, None)
    assert [p.prefix for p in plans] == ["o_train_00000", "o_train_00001", "o_train_00002",
                                         "o_valid_00000"]
    pieces = [p.pieces for p in plans]
    plain = [(q.start, q.stop) for ps in pieces[:3] for q in ps if q.file == 0]
    assert plain[0][0] == 0 and plain[-1][1] == first.size  # contiguous, all of it
    assert all(a[1] == b[0] for a, b in zip(plain, plain[1:], strict=False))
    assert plain[0][1] == (first.size + second.size) // 3  # cut by bytes, not by lines
    assert sum(q.file == 1 for ps in pieces[:3] for q in ps) == 1  # the .gz: one range
    assert pieces[3] == tuple(q for ps in pieces[:3] for q in ps)  # valid reads them all

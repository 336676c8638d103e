"""`scripts/prepare_data.py`'s options say what the code does, and the inputs it names are read.

- The held-out rule in `--help` is the one `shards.split_of` applies (CRC-32 of the text).
- `packing.seq_length`/`packing.pad_multiple` are the documented keys; `pack_size`/
  `pad_multiple` are older spellings of the same fields: still accepted, never listed, and a
  message echoing a value names the key the user typed.
- A Parquet text column of any Arrow text type (dictionary from pandas `category`,
  large_string, string_view) is read as text, batch by batch.
- A UTF-8 byte order mark opening a file is dropped from its first document only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep import readers
from data_prep.config import (
    PrepareConfig,
    check_counts,
    check_pad_multiple,
    closest_keys,
    documented_keys,
    key_name,
    parse_args,
    validate,
)
from data_prep.shards import held_out_stride, split_of
from plugins.protocol.errors import ConfigError
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prepare_data.py"
REQUIRED = ["input=a", "output=b", "tokenizer=c"]


# --- 1. the held-out rule in --help -------------------------------------------------------------


def _help() -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=HANG_S, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_help_states_the_crc32_held_out_rule_and_the_older_spellings() -> None:
    text = _help()
    assert "every 1/held_out_fraction-th document" not in text
    assert ("a document goes to valid when the CRC-32 of its text modulo "
            "round(1/held_out_fraction) is the largest residue, to test when it is the one "
            "below") in text
    assert "pack_size= and pad_multiple= are older spellings of these two keys" in text
    assert "dictionary of strings (pandas category)" in text
    assert "a UTF-8 byte order mark opening a file is dropped" in text


def test_split_of_is_the_rule_the_help_states() -> None:
    stride = held_out_stride(0.25)
    assert stride == round(1 / 0.25)
    texts = [f"document {i}" for i in range(200)]
    for text in texts:
        residue = zlib.crc32(text.encode("utf-8")) % stride
        expected = 1 if residue == stride - 1 else 2 if residue == stride - 2 else 0
        assert split_of(text, stride, ("valid", "test")) == expected
    assert {split_of(t, stride, ("valid", "test")) for t in texts} == {0, 1, 2}
    assert split_of("", stride, ("valid", "test")) == 0  # empty documents stay in train


# --- 2. packing.* keys and their older spellings ------------------------------------------------


def test_documented_keys_list_the_dotted_spelling_only() -> None:
    keys = documented_keys()
    assert "packing.seq_length" in keys and "packing.pad_multiple" in keys
    assert "pack_size" not in keys and "pad_multiple" not in keys and "typed_keys" not in keys


@pytest.mark.parametrize(("typed", "near"), [
    ("pack_sise", "packing.seq_length"),
    ("packing.seq_len", "packing.seq_length"),
    ("packing.pad_multipl", "packing.pad_multiple"),
    ("pad_multipl", "packing.pad_multiple"),
])
def test_closest_keys_suggest_the_documented_spelling(typed, near) -> None:
    assert closest_keys(typed)[0] == near


def test_unknown_key_lists_the_documented_spelling() -> None:
    with pytest.raises(ConfigError) as error:
        parse_args(["zzzz=1"])
    listed = str(error.value).split("the keys are ")[1].split(", ")
    assert "packing.seq_length" in listed and "packing.pad_multiple" in listed
    assert not {"pack_size", "pad_multiple", "typed_keys"} & set(listed)


@pytest.mark.parametrize("spelling", [("packing.seq_length", "packing.pad_multiple"),
                                      ("pack_size", "pad_multiple")])
def test_both_spellings_set_the_same_fields(spelling) -> None:
    rows, pad = spelling
    cfg = parse_args([*REQUIRED, f"{rows}=128", f"{pad}=4"])
    assert (cfg.pack_size, cfg.pad_multiple) == (128, 4)
    assert (key_name(cfg, "pack_size"), key_name(cfg, "pad_multiple")) == spelling


def test_one_field_under_both_spellings_is_refused_and_a_repeat_of_one_wins() -> None:
    """`pack_size=64 packing.seq_length=128` names one field twice (which was meant?); the same
    spelling again is an appended override, the later one standing."""
    with pytest.raises(ConfigError, match=r"^pack_size= and packing.seq_length= set the same "
                                          r"field; keep one$"):
        parse_args([*REQUIRED, "pack_size=64", "packing.seq_length=128"])
    assert parse_args([*REQUIRED, "pack_size=64", "pack_size=128"]).pack_size == 128


def test_key_name_of_a_library_caller_is_the_field_name() -> None:
    cfg = PrepareConfig(input="a", output="b", tokenizer="c", pack_size=130, pad_multiple=4)
    assert key_name(cfg, "pack_size") == "pack_size"


@pytest.mark.parametrize(("argv", "expected"), [
    (["packing.seq_length=130", "packing.pad_multiple=4"],
     "packing.seq_length=130 is not a multiple of packing.pad_multiple=4 (context parallel cuts "
     "every row into 2 x CP chunks); give e.g. packing.seq_length=128"),
    (["pack_size=130", "pad_multiple=4"],
     "pack_size=130 is not a multiple of pad_multiple=4 (context parallel cuts every row into "
     "2 x CP chunks); give e.g. packing.seq_length=128"),
    (["packing.pad_multiple=0"], "packing.pad_multiple=0 must be at least 1"),
    (["packing.pad_multiple=4"], "packing.pad_multiple=4 pads documents in a packing index, but "
     "none is written; also give packing.seq_length=<row length>, or leave "
     "packing.pad_multiple unset"),
    (["packing.seq_length=1"], "packing.seq_length=1 cannot hold a document and its next token"),
    (["pack_size=1"], "pack_size=1 cannot hold a document and its next token"),
    (["packing.seq_length=x"], "packing.seq_length expects an integer"),
    (["packing.seq_length="], "packing.seq_length is empty; give it a value, e.g. "
     "packing.seq_length=4096"),
])
def test_messages_echo_the_key_the_user_typed(argv, expected) -> None:
    with pytest.raises(ConfigError) as error:
        validate(parse_args([*REQUIRED, *argv]))
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_rules_echo_typed_keys() -> None:
    cfg = parse_args([*REQUIRED, "packing.seq_length=130", "packing.pad_multiple=4"])
    assert check_pad_multiple(cfg).startswith("packing.seq_length=130 is not a multiple of "
                                              "packing.pad_multiple=4")
    cfg = parse_args([*REQUIRED, "pack_size=1"])
    assert check_counts(cfg).startswith("pack_size=1 cannot hold")


def test_script_refusal_is_one_line_exit_2(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "input=a", "output=b", "tokenizer=c",
         "packing.seq_length=130", "packing.pad_multiple=4"],
        capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("error: packing.seq_length=130 is not a multiple of "
                           "packing.pad_multiple=4 (context parallel cuts every row into 2 x CP "
                           "chunks); give e.g. packing.seq_length=128\n")


# --- 3. Parquet text columns of every Arrow text type ---------------------------------------------

TEXTS = ["hello world", None, "a b c", "hello world", ""]


def _columns() -> dict[str, pa.Array]:
    columns = {
        "string": pa.array(TEXTS, pa.string()),
        "large_string": pa.array(TEXTS, pa.large_string()),
        "dictionary": pa.array(TEXTS, pa.string()).dictionary_encode(),
        "large_dictionary": pa.array(TEXTS, pa.large_string()).dictionary_encode(),
    }
    if hasattr(pa, "string_view"):
        columns["string_view"] = pa.array(TEXTS, pa.string_view())
    return columns


@pytest.mark.parametrize("kind", list(_columns()))
def test_every_text_type_is_text(kind) -> None:
    column = _columns()[kind]
    assert readers.is_text_type(column.type)
    assert readers.text_values(column) == TEXTS


@pytest.mark.parametrize("kind", [pa.int64(), pa.binary(), pa.list_(pa.string()),
                                  pa.dictionary(pa.int32(), pa.int64())])
def test_other_types_are_not_text(kind) -> None:
    assert not readers.is_text_type(kind)


def _pandas_category(path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": range(len(TEXTS)),
                          "text": pd.Series(TEXTS, dtype="category")})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=2)


@pytest.mark.parametrize("kind", [*_columns(), "pandas_category"])
def test_parquet_text_column_of_every_text_type_is_read(kind, tmp_path) -> None:
    path = tmp_path / f"{kind}.parquet"
    if kind == "pandas_category":
        _pandas_category(path)
    else:
        table = pa.table({"id": pa.array(range(len(TEXTS))), "text": _columns()[kind]})
        pq.write_table(table, path, row_group_size=2)
    source = readers.inspect(path, "parquet", None, "text", "line")
    assert list(readers.documents(source)) == TEXTS
    assert list(readers.documents(source, 1, 4)) == TEXTS[1:4]  # a row range across groups
    assert [t for _, t in readers.positioned_documents(source)] == TEXTS


def test_parquet_non_text_column_is_still_refused(tmp_path) -> None:
    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": pa.array([1, 2]), "body": pa.array(["a", "b"]).
                             dictionary_encode()}), path)
    with pytest.raises(ConfigError) as error:
        readers.inspect(path, "parquet", None, "text", "line")
    assert str(error.value).endswith("field 'text' holds int64, not text; set text_field to a "
                                     "text field (text fields: body)")


# --- 4. a UTF-8 byte order mark opening a file --------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(("data", "offset", "expected"), [
    (BOM + b"hello", 0, (b"hello", 3)),
    (BOM + b"hello", 12, (BOM + b"hello", 12)),  # not the file's start: text, kept
    (b"hello", 0, (b"hello", 0)),
    (BOM, 0, (b"", 3)),
])
def test_without_bom(data, offset, expected) -> None:
    assert readers.without_bom(data, offset) == expected


def _source(path: Path, fmt: str, sample_by: str = "line") -> readers.InputFile:
    compression = ".gz" if path.suffix == ".gz" else None
    return readers.inspect(path, fmt, compression, "text", sample_by)


@pytest.mark.parametrize(("name", "data", "fmt", "sample_by", "expected"), [
    ("a.txt", BOM + b"hello\n" + BOM + b"world\n", "text", "line", ["hello", "\ufeffworld"]),
    ("a.txt", BOM + b"hello\n\nworld\n", "text", "paragraph", ["hello", "world"]),
    ("a.txt", BOM + b"hello\r\nworld", "text", "document", ["hello\nworld"]),
    ("a.jsonl", BOM + b'{"text": "hello"}\n{"text": "world"}\n', "json", "line",
     ["hello", "world"]),
    ("a.json", BOM + b'[{"text": "hello"}, {"text": "world"}]', "json", "line",
     ["hello", "world"]),
])
def test_a_leading_bom_is_not_part_of_the_first_document(tmp_path, name, data, fmt, sample_by,
                                                         expected) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    source = _source(path, fmt, sample_by)
    assert list(readers.documents(source)) == expected
    assert [t for _, t in readers.positioned_documents(source)] == expected


def test_a_bom_in_a_compressed_text_file_is_dropped(tmp_path) -> None:
    import gzip

    path = tmp_path / "a.txt.gz"
    path.write_bytes(gzip.compress(BOM + b"hello\nworld\n"))
    assert list(readers.documents(_source(path, "text"))) == ["hello", "world"]


def test_a_range_after_the_first_byte_keeps_its_text(tmp_path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(BOM + b"hello\nworld\n")
    source = _source(path, "text")
    assert list(readers.documents(source, 0, 5)) == ["hello"]
    assert list(readers.documents(source, 5, source.units)) == ["world"]


def test_bad_utf8_after_a_bom_names_its_byte_in_the_file(tmp_path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(BOM + b"ab\xff\n")
    with pytest.raises(ConfigError) as error:
        list(readers.documents(_source_unchecked(path)))
    assert "at byte 5" in str(error.value)


def _source_unchecked(path: Path) -> readers.InputFile:
    size = path.stat().st_size
    return readers.InputFile(str(path), "text", None, "text", "line", size, size)


def test_files_with_a_bom_read_like_one_without(tmp_path) -> None:
    rows = [{"text": "hello"}, {"text": "world"}]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "plain.txt").write_bytes(b"hello\nworld\n")
    (tmp_path / "bom.txt").write_bytes(BOM + b"hello\nworld\n")
    (tmp_path / "bom.jsonl").write_bytes(BOM + body)
    read = {name: list(readers.documents(_source(tmp_path / name, fmt)))
            for name, fmt in [("plain.txt", "text"), ("bom.txt", "text"), ("bom.jsonl", "json")]}
    assert read["bom.txt"] == read["plain.txt"] == read["bom.jsonl"] == ["hello", "world"]

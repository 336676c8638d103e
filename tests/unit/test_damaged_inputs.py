"""Damaged inputs to `scripts/prepare_data.py` stop the job with one line naming the file and the
byte, never a traceback: a compressed file cut short or corrupted (found by the pre-flight or in
a worker process), one that is not compressed at all, bad UTF-8 (named by its byte in the
file), and a `.json` file holding one array is read, as the docs promise.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from data_prep import readers
from data_prep.config import PrepareConfig
from data_prep.prepare import prepare
from plugins.protocol.errors import ConfigError
from tests.word_tokenizer import word_tokenizer

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]
TEXT = b"".join(json.dumps({"text": f"alpha beta gamma {i}"}).encode() + b"\n"
                for i in range(2000))
_RNG = random.Random(0)
RANDOM = b"".join(json.dumps({"text": _RNG.randbytes(60).hex()}).encode() + b"\n"
                  for _ in range(4000))  # compresses little: a cut lands after many reads


def compress(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(data)
    if suffix == ".bz2":
        return bz2.compress(data, compresslevel=1)  # 100 kB blocks
    if suffix == ".xz":
        return lzma.compress(data)
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def _inspect(path: Path, compression: str | None, fmt: str = "json") -> readers.InputFile:
    return readers.inspect(path, fmt, compression, "text", "line")


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
def test_a_truncated_compressed_file_is_one_line_naming_the_byte(tmp_path, monkeypatch,
                                                                   suffix) -> None:
    monkeypatch.setattr(readers, "CHUNK", 256)  # several reads before the damage
    monkeypatch.setattr(readers, "HEAD_BYTES", 256)
    packed = compress(RANDOM, suffix)
    path = tmp_path / f"t.jsonl{suffix}"
    path.write_bytes(packed[:len(packed) * 9 // 10])
    source = _inspect(path, suffix)  # the head reads fine
    with pytest.raises(ConfigError, match=r"is damaged or truncated \(.*\) at byte [\d,]+ of "
                                          r"its decompressed text; download or compress") as err:
        list(readers.documents(source))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_gzip_whose_crc_fails_is_one_line(tmp_path) -> None:
    packed = bytearray(gzip.compress(TEXT))
    packed[-8:-4] = struct.pack("<I", 12345)  # the trailer's CRC-32
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(ConfigError, match=r"damaged or truncated \(BadGzipFile: CRC check"):
        list(readers.documents(_inspect(path, ".gz")))


@pytest.mark.parametrize("suffix,content", [
    (".gz", TEXT[:3000]),  # plain JSON lines named .gz
    (".bz2", random.Random(1).randbytes(3000)),  # seeded: each xdist worker collects the same
    (".xz", random.Random(2).randbytes(3000)),
], ids=["gz-plain-text", "bz2-random-bytes", "xz-random-bytes"])
def test_a_file_that_is_not_compressed_as_named_is_one_line(tmp_path, suffix, content) -> None:
    path = tmp_path / f"t.jsonl{suffix}"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"{path} is not a \{suffix} file .*; compress it "
                                          "again, or give it the suffix of what it holds"):
        _inspect(path, suffix)


def test_a_compressed_file_cut_in_its_first_bytes_is_one_line(tmp_path) -> None:
    path = tmp_path / "t.jsonl.zst"
    path.write_bytes(compress(RANDOM, ".zst")[:300])
    with pytest.raises(ConfigError, match=r"t.jsonl.zst is damaged or truncated \(OSError: .*\) "
                                          "while decompressing; download or compress it again"):
        _inspect(path, ".zst")


def test_damage_found_in_a_worker_process_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(readers, "CHUNK", 256)
    monkeypatch.setattr(readers, "HEAD_BYTES", 256)  # the pre-flight does not reach the damage
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    packed = gzip.compress(TEXT)
    for name in ("a", "b"):
        (corpus / f"{name}.jsonl.gz").write_bytes(packed[:len(packed) * 9 // 10])
    cfg = PrepareConfig(input=str(corpus), output=str(tmp_path / "out" / "x"),
                        tokenizer=str(word_tokenizer(tmp_path)), num_shards=2, num_proc=2)
    with pytest.raises(ConfigError, match=r"[ab].jsonl.gz is damaged or truncated .* at byte "):
        prepare(cfg, progress=False)


def test_a_json_file_holding_one_array_is_read(tmp_path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"text": "alpha"}, {"text": None}, {"text": "beta gamma"}]))
    source = _inspect(path, None)
    assert source.array and list(readers.documents(source)) == ["alpha", None, "beta gamma"]
    path.write_text(json.dumps([{"body": "alpha"}]))
    with pytest.raises(ConfigError, match="has no field 'text'"):
        _inspect(path, None)


def test_bad_utf8_is_named_by_its_byte_in_the_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(readers, "HEAD_BYTES", 8)
    path = tmp_path / "t.txt"
    data = b"one line\nanother line\nthe bad \xff here\n"
    path.write_bytes(data)
    source = _inspect(path, None, "text")
    with pytest.raises(ConfigError, match=rf"at byte {data.index(b'\xff')}:"):
        list(readers.documents(source))

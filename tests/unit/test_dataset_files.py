"""Damaged or mismatched datasets are refused before any rank starts, one case at a time.

Each case damages one thing in a sound blend (a manifest of two shards, or a bare prefix) and
must be refused by `load_blend` with one line that names the file and the fix; the sound blend
must pass. One case also runs the real entry point: `error: <line>`, exit 2, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plugins.protocol.errors import ConfigError
from recipes.config import dataset_files
from recipes.config.blend import load_blend
from recipes.config.overrides import apply_overrides
from recipes.config.path_rules import check_data_blend
from recipes.registry import get_recipe
from tests.hang import HANG_S
from tests.unit.dataset_fixtures import write_dataset

REPO = Path(__file__).resolve().parents[2]
DOCS = [[5, 6, 7, 0], [8, 9, 0], [], [10, 11, 12, 13, 0]]
OTHER = [[5, 6, 0], [7, 0]]


def _manifest(folder: Path, vocab: int = 300, eod: int = 0) -> Path:
    """Two shards and a manifest recording them as prepare_data does."""
    shards = []
    for name, docs in (("corpus_a", DOCS), ("corpus_b", DOCS[:2])):
        prefix = write_dataset(folder / name, docs)
        shards.append({"prefix": name, "tokens": sum(map(len, docs)),
                       **dataset_files.record(prefix)})
    path = folder / "corpus.json"
    path.write_text(json.dumps({"eod_id": eod, "vocab_size": vocab, "shards": shards}))
    return path


def _blend(folder: Path, text: str) -> str:
    path = folder / "blend.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def sound(tmp_path) -> tuple[Path, str]:
    manifest = _manifest(tmp_path)
    return tmp_path, _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n")


def _refused(path: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_blend(path)
    message = str(caught.value)
    assert message.startswith(f"data.blend={path}: ") and "\n" not in message
    return message


def _truncate(file: Path, size: int) -> None:
    with file.open("r+b") as stream:
        stream.truncate(size)


def test_a_sound_blend_passes(sound) -> None:
    folder, path = sound
    blend = load_blend(path)
    assert [Path(p).name for p in blend.train[0].prefixes] == ["corpus_a", "corpus_b"]
    assert blend.notes == ()


@pytest.mark.parametrize(("size", "expected"), [
    ("half", "corpus_a.idx is truncated: 3 sequences and 5 document entries need 110 bytes, "
             "it has 55; prepare"),
    (20, "corpus_a.idx is truncated: 20 bytes, shorter than the 34-byte header"),
    (0, "corpus_a.idx is empty (0 bytes); prepare"),
])
def test_a_truncated_or_empty_index_is_refused(sound, size, expected) -> None:
    folder, path = sound
    idx = folder / "corpus_a.idx"
    _truncate(idx, idx.stat().st_size // 2 if size == "half" else size)
    message = _refused(path)
    assert expected in message and "scripts/prepare_data.py" in message


def test_an_index_from_another_preparation_is_refused(sound) -> None:
    folder, path = sound
    (folder / "elsewhere").mkdir()
    other = write_dataset(folder / "elsewhere" / "corpus_a", OTHER)
    shutil.copy(other + ".idx", folder / "corpus_a.idx")
    message = _refused(path)
    assert "corpus_a.idx does not belong to" in message
    assert "the .idx comes from another preparation" in message


def test_a_bin_shorter_than_its_index_is_refused(sound) -> None:
    folder, path = sound
    _truncate(folder / "corpus_a.bin", 10)
    assert "corpus_a.bin is shorter than its index says (10 bytes" in _refused(path)


def test_files_other_than_the_manifest_recorded_are_refused(sound) -> None:
    """Same shape, other tokens: the index is sound, only the manifest's record knows."""
    folder, path = sound
    write_dataset(folder / "corpus_b", [[9, 9, 9, 0], [9, 9, 0]])
    message = _refused(path)
    assert "corpus_b.bin/.idx are not the files manifest" in message
    assert "(bin_sample_crc32 differ)" in message


def test_a_bad_header_is_refused(sound) -> None:
    folder, path = sound
    idx = folder / "corpus_a.idx"
    idx.write_bytes(b"NOTANIDX" + idx.read_bytes()[8:])
    assert "corpus_a.idx is not a Megatron indexed-dataset index" in _refused(path)


def test_a_declared_vocabulary_below_the_manifests_is_refused(tmp_path) -> None:
    manifest = _manifest(tmp_path, vocab=8192)
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\nvocab_size: 4096\n")
    assert ("declares vocab_size: 4096 but manifest" in _refused(path)
            and "holds token ids up to 8191; set vocab_size: 8192" in _refused(path))


def test_ids_of_a_bare_prefix_beyond_the_vocabulary_are_refused(tmp_path) -> None:
    prefix = write_dataset(tmp_path / "bare", [[5, 8191, 0], [7, 0]])
    path = _blend(tmp_path, f"train:\n  - {{prefix: {prefix}}}\neod_id: 0\nvocab_size: 4096\n")
    message = _refused(path)
    assert f"prefix {prefix} holds token id 8,191" in message
    assert "set vocab_size: 8192 or more in the blend" in message


def test_the_model_vocabulary_must_hold_the_blends_ids(sound) -> None:
    folder, path = sound
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", f"data.blend={path}"])
    assert "holds token ids up to 299, but model.vocab_size=256" in check_data_blend(cfg)


def test_a_bare_prefix_whose_documents_end_in_another_eod_is_refused(tmp_path) -> None:
    prefix = write_dataset(tmp_path / "bare", [[5, 6, 2], [7, 2], [8, 9, 9, 2]])
    path = _blend(tmp_path, f"train:\n  - {{prefix: {prefix}}}\neod_id: 0\nvocab_size: 300\n")
    assert "its documents end in token id 2 (3 of 3 looked at), not eod_id=0; set eod_id: 2" \
        in _refused(path)


def _tokenizer(folder: Path, eos: str) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "model": {"vocab": {"a": 0, "b": 1}},
        "added_tokens": [{"id": 7, "content": "<|endoftext|>"}, {"id": 8, "content": "</s>"}]}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))
    return folder


def test_a_bare_prefix_eod_against_the_tokenizer_it_names(tmp_path) -> None:
    prefix = write_dataset(tmp_path / "bare", [[5, 6, 7], [1, 7]])
    tokenizer = _tokenizer(tmp_path / "tok", "</s>")
    text = f"train:\n  - {{prefix: {prefix}}}\neod_id: 7\nvocab_size: 300\ntokenizer: {tokenizer}\n"
    message = _refused(_blend(tmp_path, text))
    assert f"eod_id: 7 disagrees with tokenizer {tokenizer}, whose end-of-document </s> is id 8" \
        in message
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert load_blend(_blend(tmp_path, text)).notes == ()


def test_a_bare_prefix_with_nothing_to_check_its_eod_against_is_a_warning(tmp_path,
                                                                         capsys) -> None:
    prefix = write_dataset(tmp_path / "bare", [[5, 6, 7], [1, 2]])
    path = _blend(tmp_path, f"train:\n  - {{prefix: {prefix}}}\neod_id: 0\nvocab_size: 256\n")
    assert load_blend(path).notes == (
        f"data.blend={path}: eod_id 0 of prefix {prefix} is not checked against a tokenizer (no "
        "manifest lists it); add tokenizer: <folder> to the blend to check it",)
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", f"data.blend={path}"])
    assert check_data_blend(cfg) is None
    assert capsys.readouterr().err.startswith(f"warning: data.blend={path}: eod_id 0")


def test_a_bare_prefix_listed_by_a_manifest_beside_it_is_checked_as_the_manifest_says(
        sound) -> None:
    folder, _ = sound
    path = _blend(folder, f"train:\n  - {{prefix: {folder / 'corpus_b'}}}\n")
    assert load_blend(path).eod_id == 0  # the manifest beside it gives eod_id and vocab_size
    write_dataset(folder / "corpus_b", [[9, 9, 9, 0], [9, 9, 0]])
    assert "are not the files manifest" in _refused(path)


def test_the_checks_read_the_index_not_the_tokens(tmp_path, monkeypatch) -> None:
    """A manifest's shards are checked without reading their tokens: the fingerprint reads the
    first and last 64 KiB of each .bin, and the first shard's ids are looked at in the same
    bytes (read again: page cache), whatever the size of the shard (over 1 MB here, every byte
    of a .bin read counted however it is read)."""
    long_docs = [[5] * 300_000 + [0], [7] * 300_000 + [0]]
    shards = []
    for name in ("corpus_a", "corpus_b"):
        prefix = write_dataset(tmp_path / name, long_docs)
        shards.append({"prefix": name, "tokens": 600_002, **dataset_files.record(prefix)})
    assert all(shard["bin_bytes"] > 16 * dataset_files.SAMPLE_BYTES for shard in shards)
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"eod_id": 0, "vocab_size": 300, "shards": shards}))
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n")
    read: dict[str, int] = {}
    real_memmap, real_fromfile, real_open = np.memmap, np.fromfile, Path.open

    def no_bin(file, *args, **kwargs):
        assert not str(file).endswith(".bin"), file
        return real_memmap(file, *args, **kwargs)

    def counted_fromfile(file, dtype=float, count=-1, *args, **kwargs):
        tokens = real_fromfile(file, dtype, count, *args, **kwargs)
        read[Path(file).name] = read.get(Path(file).name, 0) + tokens.nbytes
        return tokens

    def counted_open(self, mode="r", *args, **kwargs):
        stream = real_open(self, mode, *args, **kwargs)
        if self.suffix != ".bin":
            return stream
        real_read = stream.read

        def counted_read(size=-1):
            data = real_read(size)
            read[self.name] = read.get(self.name, 0) + len(data)
            return data

        stream.read = counted_read
        return stream

    monkeypatch.setattr(dataset_files.np, "memmap", no_bin)
    monkeypatch.setattr(dataset_files.np, "fromfile", counted_fromfile)
    monkeypatch.setattr(Path, "open", counted_open)
    load_blend(path)
    sample = dataset_files.SAMPLE_BYTES
    assert read.keys() == {"corpus_a.bin", "corpus_b.bin"}, read  # each fingerprinted
    assert read["corpus_a.bin"] <= 4 * sample and read["corpus_b.bin"] <= 2 * sample, read


def test_the_entry_point_refuses_a_damaged_index_in_one_line(sound) -> None:
    folder, path = sound
    _truncate(folder / "corpus_a.idx", 20)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    done = subprocess.run(
        [sys.executable, "scripts/pretrain.py", "recipe=tiny_dp1", "model.vocab_size=300",
         "data.source=blend", f"data.blend={path}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: data.blend={path}: {folder}/corpus_a.idx is truncated: 20 bytes, shorter than "
        "the 34-byte header; prepare " f"{folder}/corpus_a again with scripts/prepare_data.py "
        "(or restore both files)"]

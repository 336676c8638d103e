"""A damaged `.npy` file in a run's `data_index/` cache is refused in one line naming the file and
the fix (delete the folder), before Megatron's GPTDataset loads it (trainer/data_index_cache.py);
each rule fires alone here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.npy_file import npy_problem
from plugins.protocol.errors import ConfigError
from trainer.data_index_cache import (
    cache_entry_problem,
    check_data_index_cache,
    damaged_cache_message,
)

NAME = "353bbf5977aa798cae82588bdf4ff783-ShardedGPTDataset-valid-document_index.npy"


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    """A cache folder with one index file as Megatron writes it (int32, allow_pickle=True)."""
    folder = tmp_path / "data_index"
    folder.mkdir()
    path = folder / NAME
    np.save(path, np.arange(200, dtype=np.int32), allow_pickle=True)
    (folder / "353bbf5977aa798cae82588bdf4ff783-ShardedGPTDataset-valid-description.txt"
     ).write_text("{}")
    return folder, path


def test_a_whole_cache_passes(tmp_path):
    folder, path = _cache(tmp_path)
    np.save(folder / "b-BlendedDataset-train-dataset_index.npy", np.zeros(7, np.int16))
    np.save(folder / "c-ShardedGPTDataset-train-sample_index.npy", np.zeros((5, 2), np.int64))
    assert npy_problem(path) is None
    assert damaged_cache_message(folder) is None
    check_data_index_cache(folder)


def test_no_cache_folder_yet_passes(tmp_path):
    assert damaged_cache_message(tmp_path / "data_index") is None


def test_a_version_2_header_is_read(tmp_path):
    path = tmp_path / "v2.npy"
    with open(path, "wb") as file:
        np.lib.format.write_array(file, np.arange(9, dtype=np.int64), version=(2, 0))
    assert npy_problem(path) is None


def test_a_header_written_over_is_refused(tmp_path):
    _, path = _cache(tmp_path)
    data = bytearray(path.read_bytes())
    data[:300] = np.random.default_rng(0).bytes(300)
    path.write_bytes(bytes(data))
    assert npy_problem(path).startswith("is damaged: its numpy header cannot be read (")


def test_a_file_cut_inside_its_header_is_refused(tmp_path):
    _, path = _cache(tmp_path)
    path.write_bytes(path.read_bytes()[:10])
    assert "EOF: reading array header" in npy_problem(path)


def test_an_empty_file_is_refused(tmp_path):
    _, path = _cache(tmp_path)
    path.write_bytes(b"")
    assert "numpy header cannot be read" in npy_problem(path)


def test_a_file_cut_after_its_header_is_refused(tmp_path):
    _, path = _cache(tmp_path)
    path.write_bytes(path.read_bytes()[:-4])
    size = path.stat().st_size
    assert npy_problem(path) == (f"is damaged: it is {size:,} bytes, but its header (int32 "
                                 f"(200,)) says {size + 4:,} (cut short or written over)")


def test_bytes_after_the_array_are_refused(tmp_path):
    _, path = _cache(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0" * 8)
    assert "but its header (int32 (200,)) says" in npy_problem(path)


def test_an_array_of_python_objects_is_refused_unread(tmp_path):
    _, path = _cache(tmp_path)
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert npy_problem(path) == ("is damaged: it holds Python objects (object), not plain "
                                 "numbers")


def test_a_folder_named_like_an_index_file_is_refused(tmp_path):
    folder, path = _cache(tmp_path)
    path.unlink()
    path.mkdir()
    assert cache_entry_problem(path) == "is not a regular file"
    assert "is not a regular file; delete the folder" in damaged_cache_message(folder)


def test_the_refusal_is_one_line_naming_the_file_and_the_fix(tmp_path):
    folder, path = _cache(tmp_path)
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(ConfigError) as error:
        check_data_index_cache(folder)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"Megatron's dataset index cache file {path} is damaged: ")
    assert message.endswith(f"; delete the folder {folder} (Megatron builds the same indexes "
                            "again at the next start)")


def test_the_trainer_checks_the_cache_before_megatron_reads_it(tmp_path):
    """`megatron_sources` refuses the damaged cache before it builds any config or dataset
    (so nothing else of the run is needed to reach the check)."""
    from trainer.data import megatron_sources

    folder, path = _cache(tmp_path)
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ConfigError, match=f"cache file {path} is damaged"):
        megatron_sources(None, None, folder, 1, 1)

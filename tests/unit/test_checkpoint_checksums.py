"""The launch check's CRC-32s (`trainer/checkpoint/checksums.py`): several files read side by side
give each file's own CRC-32, a file that cannot be read gives its error (the check names it)."""

from __future__ import annotations

import zlib

import pytest

from trainer.checkpoint import checksums
from trainer.checkpoint.checksums import crc32s


@pytest.mark.parametrize("readers", [1, 3])
def test_each_file_gets_its_own_crc_whatever_the_readers(tmp_path, monkeypatch, readers):
    monkeypatch.setattr(checksums, "CHUNK_BYTES", 7)  # several chunks a file
    files = []
    for index in range(5):
        path = tmp_path / f"__{index}_0.distcp"
        path.write_bytes(bytes(range(index * 13 % 256, 256)) * (index + 1))
        files.append(path)
    found = crc32s(files, readers=readers, show=False)
    assert found == {path: zlib.crc32(path.read_bytes()) for path in files}


def test_a_file_that_cannot_be_read_gives_its_error(tmp_path):
    good, gone = tmp_path / "a", tmp_path / "b"
    good.write_bytes(b"abc")
    found = crc32s([good, gone], readers=2, show=False)
    assert found[good] == zlib.crc32(b"abc") and isinstance(found[gone], FileNotFoundError)



def test_a_long_read_off_a_terminal_says_what_it_reads_and_what_it_took(tmp_path, monkeypatch,
                                                                      capsys):
    """No bar in a Slurm log: a read of LOGGED_BYTES or more is two lines there instead."""
    files = [tmp_path / "a", tmp_path / "b"]
    for path in files:
        path.write_bytes(b"x" * 600)
    monkeypatch.setattr(checksums, "LOGGED_BYTES", 1200)
    crc32s(files, readers=4, show=False)
    start, end = capsys.readouterr().err.splitlines()
    assert start == ("checking 2 checkpoint files, 0.0 GiB, against their CRC-32s (2 at once; "
                     "checkpoint.verify=size checks sizes only)")
    assert end.startswith("checked 0.0 GiB in ") and end.endswith(" GiB/s)")
    monkeypatch.setattr(checksums, "LOGGED_BYTES", 1201)  # shorter: silent, as before
    crc32s(files, readers=4, show=False)
    assert capsys.readouterr().err == ""

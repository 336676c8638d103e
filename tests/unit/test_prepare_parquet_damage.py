"""A Parquet file whose footer reads but whose data page is damaged stops the job with one line
naming the file and the row group (Arrow's OSError or ArrowException), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep.readers import InputFile, documents
from plugins.protocol.errors import ConfigError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _damaged(tmp_path: Path) -> Path:
    path = tmp_path / "d.parquet"
    texts = [f"document {i} " + "alpha beta gamma " * (i % 7) for i in range(400)]
    pq.write_table(pa.table({"text": texts}), path, compression="snappy")
    data = bytearray(path.read_bytes())
    data[200:2000] = bytes(1800)  # a data page; the footer at the end is intact
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_data_page_is_one_line_naming_the_file_and_row_group(tmp_path) -> None:
    path = _damaged(tmp_path)
    handle = pq.ParquetFile(path)  # the footer still reads
    source = InputFile(str(path), "parquet", None, "text", "line", path.stat().st_size,
                       handle.metadata.num_rows)
    with pytest.raises(ConfigError, match=rf"input file {path} is damaged \(\w+: .*\) in row "
                                          r"group 0; download or write it again"):
        list(documents(source))

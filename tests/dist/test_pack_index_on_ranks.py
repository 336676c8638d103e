"""A packed run's ranks read a pack index's pieces once per run, not once per rank: rank 0 checks
every piece against the dataset's documents (building a missing index first) and tells the
others; they check its JSON, headers and sizes only. A damaged index is still the same one line
on every rank before the first step. At 10 M pieces the pass is about 0.35 s and 240 MB read, so
on a shared file system the pieces are read by one rank instead of all of them; and once per
run, not once per launch: rank 0 records what it read whole (`trainer/pack_checks.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep.packing import REPAIR, pack_index_paths
from tests.dist.prepared_data import write_byte_dataset

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.prepared_data:open_pack_index"
SEQ = 128


def test_rank_0_reads_the_pieces_once_per_run_and_again_when_a_file_changed(launch_ranks,
                                                                           tmp_path):
    """The first launch builds the missing index and only rank 0 reads its pieces; the run's
    record (its data_index folder) spares a relaunch that read; a pieces file written again since
    (here garbled) has another version, so it is read and refused: the same line on every
    rank."""
    prefix = write_byte_dataset(tmp_path, max_bytes=20_000)
    payload = {"prefix": prefix, "seq": SEQ, "record": str(tmp_path / "run" / "data_index")}
    first = launch_ranks(2, ENTRY, payload)
    assert [rank["reads"] for rank in first] == [1, 0]
    assert first[0]["packs"] == first[1]["packs"] > 1 and first[0]["first"] == first[1]["first"]
    assert all(path.is_file() for path in pack_index_paths(prefix, SEQ))
    again = launch_ranks(2, ENTRY, payload)
    assert [rank["reads"] for rank in again] == [0, 0] and again[0]["packs"] > 1
    pieces = pack_index_paths(prefix, SEQ)[0]
    data = bytearray(pieces.read_bytes())
    data[200:400] = np.random.default_rng(1).bytes(200)
    pieces.write_bytes(bytes(data))
    ranks = launch_ranks(2, ENTRY, payload)
    assert [rank["reads"] for rank in ranks] == [1, 0]
    assert ranks[0]["error"] == ranks[1]["error"]
    assert ranks[0]["error"].startswith(f"pack index file {pieces} is damaged: piece ")
    assert ranks[0]["error"].endswith(REPAIR)

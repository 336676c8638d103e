"""A packed run's ranks read a pack index's pieces once per run, not once per rank: rank 0 checks
every piece against the dataset's documents (building a missing index first) and tells the
others; they check its JSON, headers and sizes only. A damaged index is still the same one line
on every rank before the first step. At 10 M pieces the pass is about 0.35 s and 240 MB read, so
on a shared file system the pieces are read by one rank instead of all of them; and once per
run, not once per launch: rank 0 records what it read whole (`trainer/pack_checks.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep.packing import REPAIR, build_pack_index, pack_index_paths
from tests.dist.prepared_data import write_byte_dataset

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.prepared_data:open_pack_index"
SEQ = 128


def test_only_rank_0_reads_the_pieces_and_a_missing_index_is_built_once(launch_ranks, tmp_path):
    prefix = write_byte_dataset(tmp_path, max_bytes=20_000)
    ranks = launch_ranks(2, ENTRY, {"prefix": prefix, "seq": SEQ})
    assert [rank["reads"] for rank in ranks] == [1, 0]
    assert ranks[0]["packs"] == ranks[1]["packs"] > 1 and ranks[0]["first"] == ranks[1]["first"]
    assert all(path.is_file() for path in pack_index_paths(prefix, SEQ))


def test_a_garbled_index_is_the_same_line_on_every_rank(launch_ranks, tmp_path):
    prefix = write_byte_dataset(tmp_path, max_bytes=20_000)
    build_pack_index(prefix, SEQ, seed=1)
    pieces = pack_index_paths(prefix, SEQ)[0]
    data = bytearray(pieces.read_bytes())
    data[200:400] = np.random.default_rng(1).bytes(200)
    pieces.write_bytes(bytes(data))
    ranks = launch_ranks(2, ENTRY, {"prefix": prefix, "seq": SEQ})
    assert ranks[0]["error"] == ranks[1]["error"]
    assert ranks[0]["error"].startswith(f"pack index file {pieces} is damaged: piece ")
    assert ranks[0]["error"].endswith(REPAIR) and ranks[1]["reads"] == 0


def test_a_relaunch_reads_the_pieces_again_only_when_a_file_changed(launch_ranks, tmp_path):
    """The run's record (its data_index folder) spares the second launch's read; a pieces file
    written again since (here garbled) has another version, so it is read and refused."""
    prefix = write_byte_dataset(tmp_path, max_bytes=20_000)
    payload = {"prefix": prefix, "seq": SEQ, "record": str(tmp_path / "run" / "data_index")}
    assert [rank["reads"] for rank in launch_ranks(2, ENTRY, payload)] == [1, 0]
    again = launch_ranks(2, ENTRY, payload)
    assert [rank["reads"] for rank in again] == [0, 0] and again[0]["packs"] > 1
    pieces = pack_index_paths(prefix, SEQ)[0]
    data = bytearray(pieces.read_bytes())
    data[200:400] = np.random.default_rng(1).bytes(200)
    pieces.write_bytes(bytes(data))
    ranks = launch_ranks(2, ENTRY, payload)
    assert ranks[0]["reads"] == 1 and ranks[0]["error"] == ranks[1]["error"]
    assert ranks[0]["error"].startswith(f"pack index file {pieces} is damaged: piece ")

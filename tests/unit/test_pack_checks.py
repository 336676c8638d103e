"""The run's record of pack indexes rank 0 read whole (`trainer/pack_checks.py`): known by the
exact versions of the index's files and its dataset's `.idx`, and only ever a saving."""

from __future__ import annotations

import os

import numpy as np

from data_prep.packing import build_pack_index, pack_index_paths
from tests.unit.dataset_fixtures import write_dataset
from trainer.pack_checks import RECORD, CheckedIndexes, file_versions

SEQ = 128


def _index(tmp_path) -> str:
    rng = np.random.default_rng(0)
    prefix = write_dataset(tmp_path / "d", [rng.integers(1, 256, int(n)).tolist() + [0]
                                            for n in rng.integers(5, 300, 40)])
    build_pack_index(prefix, SEQ, seed=1)
    return prefix


def test_an_index_read_whole_is_known_at_the_next_launch_until_a_file_changes(tmp_path):
    prefix = _index(tmp_path)
    versions = file_versions(prefix, SEQ, 1)
    assert len(versions) == 4 and str(pack_index_paths(prefix, SEQ)[0]) in versions
    first = CheckedIndexes(tmp_path / "data_index")
    assert not first.known(versions)
    first.add(versions)
    first.save()
    assert CheckedIndexes(tmp_path / "data_index").known(versions)
    for path in [*pack_index_paths(prefix, SEQ), f"{prefix}.idx"]:
        facts = os.stat(path)
        os.utime(path, ns=(facts.st_atime_ns, facts.st_mtime_ns + 1))  # written again
        assert not CheckedIndexes(tmp_path / "data_index").known(file_versions(prefix, SEQ, 1))
        os.utime(path, ns=(facts.st_atime_ns, facts.st_mtime_ns))
    assert CheckedIndexes(tmp_path / "data_index").known(file_versions(prefix, SEQ, 1))


def test_a_record_that_cannot_be_read_or_written_only_costs_a_read(tmp_path):
    prefix = _index(tmp_path)
    (tmp_path / RECORD).write_text("{not json")
    garbled = CheckedIndexes(tmp_path)
    assert garbled.record == {} and not garbled.known(file_versions(prefix, SEQ, 1))
    (tmp_path / "taken").write_text("a file where the folder goes")
    blocked = CheckedIndexes(tmp_path / "taken" / "data_index")
    blocked.add(file_versions(prefix, SEQ, 1))
    blocked.save()  # no folder can be made there: nothing raised, nothing written
    assert blocked.changed and not (tmp_path / "taken" / "data_index").exists()

"""Pack indexes rank 0 has read whole for this run, so a relaunch does not read them again.

At every start rank 0 reads each piece of each pack index against its dataset's documents
(`PackIndex(check_pieces=True)`): about 0.35 s and 240 MB per 10 M pieces, so a 15 T-token
corpus (~10^10 documents, a piece each) costs one rank many minutes of reading at every requeue
while the others wait. What it read whole is recorded in
`<run_dir>/data_index/pack_indexes_checked.json` with each file's version (size and mtime of the
pieces, offsets and JSON files and of the dataset's `.idx`); an index whose four files are as
they were is opened as the other ranks open it (JSON, headers and sizes). A file written since
(prepare_data again, the trainer's rebuild, a copy) has another version and is read again. Not
found then: a file damaged in place with its size and mtime kept, as the other ranks' look does
not find a body garbled at the right size.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from data_prep.packing import pack_index_paths
from recipes.config.dataset_files import idx_path

RECORD = "pack_indexes_checked.json"


def file_versions(prefix: str, seq_length: int, pad_multiple: int) -> dict[str, list[int]]:
    """{path: [bytes, mtime in ns]} of a pack index's three files and its dataset's `.idx`."""
    paths = [*pack_index_paths(prefix, seq_length, pad_multiple), idx_path(prefix)]
    versions = {}
    for path in paths:
        facts = os.stat(path)
        versions[str(path)] = [facts.st_size, facts.st_mtime_ns]
    return versions


class CheckedIndexes:
    """The record of one run's checked pack indexes (rank 0's): read at start, written once
    after every index of the data is open. A record that is missing or cannot be read is an
    empty one (everything is read again), never a refusal: it only saves work."""

    def __init__(self, folder: Path):
        self.path = folder / RECORD
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {}
        self.record = record if isinstance(record, dict) else {}
        self.changed = False

    def known(self, versions: dict[str, list[int]]) -> bool:
        """Whether this exact set of file versions was read whole before."""
        return self.record.get(_key(versions)) == versions

    def add(self, versions: dict[str, list[int]]) -> None:
        self.record[_key(versions)] = versions
        self.changed = True

    def save(self) -> None:
        """Write the record beside and rename it, when anything was added. A folder that takes
        no file (full, read-only) keeps the old record: the next launch reads the pieces again,
        the rule before the record existed, rather than stopping this one."""
        if not self.changed:
            return
        partial = self.path.with_name(f".{self.path.name}.partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(self.record, indent=1), encoding="utf-8")
            os.replace(partial, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            return
        self.changed = False


def _key(versions: dict[str, list[int]]) -> str:
    """The index's JSON file names the entry (the third of `file_versions`' paths)."""
    return list(versions)[2]

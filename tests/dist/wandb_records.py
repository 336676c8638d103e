"""Read an offline W&B run back: the history rows a run's `.wandb` file holds.

wandb 0.31 ships no reader for its run files (the older `wandb.sdk.internal.datastore` is gone),
so this decodes the documented layout: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then
LevelDB-log records in 32 KiB blocks (4-byte CRC, 2-byte length, 1-byte type: full, first,
middle, last), each whole record a `wandb_internal_pb2.Record`. The logging tests use it to
compare an offline run with metrics.jsonl.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from tests.hang import HANG_S

HEADER = b":W&B\xe1\xbe\x00"
BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    """Each whole record's bytes, reassembled from the block chunks."""
    position, pending = len(HEADER), b""
    while position + CHUNK_HEADER <= len(data):
        room = BLOCK - position % BLOCK
        if room < CHUNK_HEADER:  # block trailer: padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + CHUNK_HEADER])
        if kind == 0:  # zero padding up to the end of the block
            position += room
            continue
        chunk = data[position + CHUNK_HEADER:position + CHUNK_HEADER + length]
        position += CHUNK_HEADER + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            yield pending


def read_history(run_file: Path) -> list[dict]:
    """The logged rows of a `run-<id>.wandb` file, values decoded from JSON, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{run_file} is not a W&B run file (header {data[:7]!r})")
    rows = []
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def find_run_files(run_dir: Path) -> list[Path]:
    """The `.wandb` files of the offline W&B runs under a training run's directory."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))


def wait_for_history(run_dir: Path, rows: int, wait_s: float = HANG_S) -> list[dict]:
    """The rows of the one offline run under `run_dir`, waiting (at most `wait_s`) until it
    holds `rows` of them: W&B's service process may still be writing just after `finish`."""
    deadline = time.monotonic() + wait_s
    while True:
        files = find_run_files(run_dir)
        found = read_history(files[0]) if len(files) == 1 else []
        if len(found) >= rows or time.monotonic() > deadline:
            return found
        time.sleep(0.5)

"""The CRC-32s of a checkpoint's files, read side by side with a bar: the launch check of a big one.

Why: `checkpoint.verify=checksum` (the default) reads every byte of the checkpoint a run resumes
from before any rank starts. One reader at about 1 GB/s takes a quarter of an hour for a 1 TB
checkpoint (a 70B model with its optimizer state) and said nothing meanwhile. `zlib.crc32`
releases the GIL on large buffers, so a few threads read and sum files at once (a parallel file
system serves many readers, a local disk at least overlaps reading and summing), and a bar on a
terminal shows the bytes read and the time left.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK_BYTES = 8 << 20
MAX_READERS = 8  # threads reading at once: enough to keep a parallel file system busy


def file_crc32(path: Path, advance=lambda count: None) -> tuple[int, int]:
    """(CRC-32, bytes read) of one file, read in chunks; `advance(bytes)` after each."""
    crc = size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
            advance(len(chunk))
    return crc, size


def crc32s(paths: Sequence[Path], readers: int | None = None,
           show: bool | None = None) -> dict[Path, int | OSError]:
    """{path: its CRC-32, or the OSError that stopped its reading} for every path, read by up to
    `readers` threads (default: the cores, at most MAX_READERS); the bar is shown on a terminal
    (`show`: None) or as asked."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    sizes = {path: _size(path) for path in paths}
    bar = Progress(TextColumn("checking checkpoint files (CRC-32)"), BarColumn(),
                   DownloadColumn(), TimeRemainingColumn(), console=console, transient=True,
                   disable=not (console.is_terminal if show is None else show))
    readers = readers or min(MAX_READERS, os.cpu_count() or 1)

    def one(path: Path) -> int | OSError:
        try:
            return file_crc32(path, lambda count: bar.update(task, advance=count))[0]
        except OSError as error:
            return error

    with bar:
        task = bar.add_task("crc", total=sum(sizes.values()))
        with ThreadPoolExecutor(max_workers=max(1, readers)) as pool:
            return dict(zip(paths, pool.map(one, paths), strict=True))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

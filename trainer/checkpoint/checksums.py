"""The CRC-32s of a checkpoint's files, read side by side with a bar: the launch check of a big one.

Why: `checkpoint.verify=checksum` (the default) reads every byte of the checkpoint a run resumes
from before any rank starts. One reader at about 1 GB/s takes a quarter of an hour for a 1 TB
checkpoint (a 70B model with its optimizer state) and said nothing meanwhile. `zlib.crc32`
releases the GIL on large buffers, so a few threads read and sum files at once (a parallel file
system serves many readers, a local disk at least overlaps reading and summing), and a bar on a
terminal shows the bytes read and the time left. Off a terminal (a Slurm job's log), where no
bar is drawn, a read of LOGGED_BYTES or more says what it reads before and what it took after,
so a launch that sits reading terabytes is not mistaken for a hung one.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK_BYTES = 8 << 20
MAX_READERS = 8  # threads reading at once: enough to keep a parallel file system busy
LOGGED_BYTES = 1 << 30  # a read this long is said in a log that shows no bar


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
    shown = console.is_terminal if show is None else show
    bar = Progress(TextColumn("checking checkpoint files (CRC-32)"), BarColumn(),
                   DownloadColumn(), TimeRemainingColumn(), console=console, transient=True,
                   disable=not shown)
    readers = readers or min(MAX_READERS, os.cpu_count() or 1)
    total, start = sum(sizes.values()), time.perf_counter()
    logged = not shown and total >= LOGGED_BYTES
    if logged:
        print(f"checking {len(paths):,} checkpoint files, {total / 2**30:,.1f} GiB, against their "
              f"CRC-32s ({min(readers, len(paths))} at once; checkpoint.verify=size checks sizes "
              "only)", file=sys.stderr, flush=True)

    def one(path: Path) -> int | OSError:
        try:
            return file_crc32(path, lambda count: bar.update(task, advance=count))[0]
        except OSError as error:
            return error

    with bar:
        task = bar.add_task("crc", total=total)
        with ThreadPoolExecutor(max_workers=max(1, readers)) as pool:
            found = dict(zip(paths, pool.map(one, paths), strict=True))
    if logged:
        seconds = time.perf_counter() - start
        print(f"checked {total / 2**30:,.1f} GiB in {seconds:,.0f} s "
              f"({total / 2**30 / max(seconds, 1e-9):,.2f} GiB/s)", file=sys.stderr, flush=True)
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

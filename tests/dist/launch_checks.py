"""Per-rank functions for tests/dist/test_launch_ranks.py (run through the `launch_ranks`
fixture): ranks that abort as glibc aborts on a damaged heap."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def abort_once_on_damaged_heap(payload: dict) -> dict:
    """Rank 1 of the first launch writes glibc's line and aborts; every other run returns."""
    marker = Path(payload["marker"])
    if int(os.environ["RANK"]) == 1 and not marker.exists():
        marker.write_text("aborted")
        sys.stderr.write("malloc(): unaligned tcache chunk detected\n")
        sys.stderr.flush()
        os.abort()
    return {"rank": int(os.environ["RANK"])}


def abort_on_damaged_heap(payload: dict) -> dict:
    """Rank 1 writes glibc's line and aborts, every time."""
    if int(os.environ["RANK"]) == 1:
        sys.stderr.write("free(): invalid pointer\n")
        sys.stderr.flush()
        os.abort()
    return {"rank": int(os.environ["RANK"])}

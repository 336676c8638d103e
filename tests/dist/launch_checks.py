"""Per-rank functions for tests/dist/test_launch_ranks.py (run through the `launch_ranks`
fixture): ranks that abort as glibc aborts on a damaged heap, or segfault as the rare Megatron FSDP
crash did (tests/dist/relaunch.py)."""

from __future__ import annotations

import os
import signal
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


def _segfault_with_stack(stack: str) -> None:
    """Python's fault handler's words and stack, then a real SIGSEGV."""
    sys.stderr.write(f"Fatal Python error: Segmentation fault\n\n{stack}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)


def segfault_once_in_megatron_fsdp(payload: dict) -> dict:
    """Rank 0 of the first launch dies as the FSDP crash did (a segfault in Megatron FSDP's
    bucket gather); every other run returns."""
    marker = Path(payload["marker"])
    if int(os.environ["RANK"]) == 0 and not marker.exists():
        marker.write_text("segfault")
        _segfault_with_stack('  File ".../megatron/core/distributed/fsdp/src/megatron_fsdp/'
                             'param_and_grad_buffer.py", line 1343 in fetch_bucket')
    return {"rank": int(os.environ["RANK"])}


def segfault_elsewhere(payload: dict) -> dict:
    """Rank 0 segfaults outside Megatron FSDP: not the known crash, so not started again."""
    if int(os.environ["RANK"]) == 0:
        _segfault_with_stack('  File ".../trainer/step.py", line 92 in run_schedule')
    return {"rank": int(os.environ["RANK"])}

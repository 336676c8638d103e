"""Launches started once more after a rank died of the rare Megatron FSDP crash on gloo (the
`launch_ranks` fixture in tests/dist/conftest.py; a module of its own so tests and the conftest
share the list).
"""

from __future__ import annotations

import signal
from pathlib import Path

# glibc's words when it finds its heap damaged and aborts the process. A Megatron FSDP run on
# gloo ranks (ZeRO-3's parameter all-gathers) has died so, rarely (two of some ten full-suite
# runs, never in about fifty runs of the FSDP tests alone, also not under glibc's checking
# allocator); the cause is not found. Megatron FSDP freeing a bucket that an unfinished
# all-gather still writes is ruled out (tests/dist/bucket_free_check.py, test_fsdp.py), and the
# two runs that died, repeated whole under valgrind's memcheck (ZeRO-3 with overlapped gathers,
# 3 steps; ZeRO-3 saved after step 2 of 4), wrote to no freed or unowned memory. Such a launch
# is started once more, and the session's summary lists it (`RELAUNCHED`), so a crash is seen,
# not hidden, and one does not fail CI.
HEAP_DAMAGE = ("malloc(): ", "free(): ", "double free or corruption",
               "corrupted size vs. prev_size")
# The same crash seen once as a segmentation fault (a fresh-clone CI run on 2026-12-05, the
# ZeRO-3 save-and-resume fixture of test_fsdp.py): Python's fault handler printed the rank's
# main thread in Megatron FSDP's bucket gather (`param_and_grad_buffer.py:1343`, `fetch_bucket`
# setting `p.data`, under `all_gather_params` in backward's pre-unshard) while gloo's threads
# ran. Only a segfault whose stack is in Megatron FSDP counts as this crash.
SEGFAULT = "Fatal Python error: Segmentation fault"
FSDP_FRAMES = "megatron_fsdp/"
RELAUNCHED: list[str] = []


def _known_crash(code: int, stderr: str) -> str | None:
    for line in stderr.splitlines():
        if line.startswith(HEAP_DAMAGE):
            return line.strip()
    if code == -signal.SIGSEGV and SEGFAULT in stderr and \
            FSDP_FRAMES in stderr.split(SEGFAULT, 1)[1]:
        return f"{SEGFAULT} in Megatron FSDP"
    return None


def known_crash(reply: dict, run_dir: Path, nprocs: int) -> str | None:
    """'rank R: <what killed it>' when a failed rank died of the crash above (glibc's abort on
    a damaged heap, or a segfault inside Megatron FSDP), else None."""
    for rank, code in enumerate(reply["returncodes"]):
        stderr = run_dir / f"rank{rank}.stderr"
        if code == 0 or not stderr.exists():
            continue
        if (what := _known_crash(code, stderr.read_text(errors="replace"))) is not None:
            return f"rank {rank}: {what}"
    return None

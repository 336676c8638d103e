"""How long a test waits on what it started before calling it hung, and how many children run
at once.

A wait is a safety net against a hang, never a speed check: on a loaded machine (two cores
shared by several suites) a process that takes seconds when idle can take minutes, and a test
that then fails says nothing about the code. So every wait on a child process, a launch of
ranks or a file still being written uses `HANG_S`, and children that could all start together
run at most `cores()` at once, so they do not stretch each other's start-up past any limit.
"""

from __future__ import annotations

import os

HANG_S = 30 * 60.0


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return max(1, len(os.sched_getaffinity(0)))

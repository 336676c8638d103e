"""Independent child processes of one test module, run side by side, at most `cores()` at once.

The suite runs one test at a time, and a child that computes on one core (a benchmark script, a
one-rank run, a data preparation: CPU ranks run one intra-op thread) leaves the other core idle
while the test waits for it. Children whose results do not depend on each other are started
together by the module's fixture instead, and each test checks its own child's result. At most
one per core (tests/hang.py), so no child's start-up is stretched by more than the suite alone
would stretch it; every wait is `HANG_S`, a safety net, never a speed limit.

    with side_by_side() as pool:
        done = {name: pool.submit(run_child, argv) for name, argv in commands.items()}
    results = {name: future.result() for name, future in done.items()}
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.hang import HANG_S, cores

REPO = Path(__file__).resolve().parents[1]


def side_by_side() -> ThreadPoolExecutor:
    """A pool whose `submit(run_child, argv)` starts at most one child per core at once, in the
    order submitted (submit the longest first)."""
    return ThreadPoolExecutor(cores(), thread_name_prefix="child")


def run_child(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`argv` run from the repository root to its end; its exit code, stdout and stderr."""
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
                          **kwargs)


def selected_tests(request) -> set[str]:
    """The names (with their parameters, `test_x[case]`) of the requesting module's tests this
    session runs: a module fixture starts only the children its selected tests read (`pytest
    -k`, a node id)."""
    return {item.name for item in request.session.items
            if getattr(item, "module", None) is request.module}

"""The asynchronous writer's results manager, forked from the rank (trainer/checkpoint/
megatron_fixes.py `forked_results_queue`), is no copy of the rank that outlives it: it takes
SIGTERM's default action again (it inherits the trainer's stop handler, which only notes the
signal) and ends when the rank that forked it is killed. (tests/dist/test_parent_death.py
kills a real run's rank.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
GONE_S = 5.0
RANK = textwrap.dedent("""
    import signal, time
    signal.signal(signal.SIGTERM, lambda *_: None)  # the trainer's stop handler only notes it
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from trainer.checkpoint.megatron_fixes import forked_results_queue
    forked_results_queue()
    print(filesystem_async._results_queue._manager._process.pid, flush=True)
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    """A live process (not gone, not a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in "ZX"


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def start_rank() -> tuple[subprocess.Popen, int]:
    """A process standing in for a rank, and the pid of the manager it forked."""
    rank = subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    line = rank.stdout.readline()
    assert line.strip().isdigit(), "the stand-in rank printed no manager pid"
    return rank, int(line)


def stop(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_manager_ends_on_sigterm(tmp_path):
    rank, manager = start_rank()
    try:
        os.kill(manager, signal.SIGTERM)
        assert gone_within(manager, GONE_S)
    finally:
        stop(rank.pid, manager)
        rank.wait(timeout=HANG_S)


def test_the_manager_ends_with_its_rank(tmp_path):
    rank, manager = start_rank()
    try:
        rank.kill()
        rank.wait(timeout=HANG_S)
        assert gone_within(manager, GONE_S)
    finally:
        stop(manager)

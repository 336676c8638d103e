"""A process that ends with the one that started it: torch's launcher starts every rank in a
session of its own (start_new_session=True), so a launcher killed with SIGKILL (or by the OOM
killer) would leave its ranks training and publishing checkpoints, and what a rank forks (the
async writer's results manager) would outlive it the same way. Linux's PR_SET_PDEATHSIG does it
where it can; a watcher thread elsewhere."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # how often the watcher thread (no prctl) looks at the parent


def end_with_parent(parent: int | None, signum: int = signal.SIGKILL,
                    forked_by_main_thread: bool = True) -> None:
    """End this process with `signum` when its parent dies: torch's launcher starts every rank
    in a session of its own (start_new_session=True), so a launcher killed with SIGKILL (or by
    the OOM killer) leaves its ranks training, and what they fork outlives them the same way.

    `parent`: the pid this process was started by, when known; a parent that died before this
    was armed is caught by the check after it (else only a reparenting to init is seen).
    Linux's PR_SET_PDEATHSIG fires when the *thread* that forked this process ends, so a
    process forked by another thread than its parent's main one is watched by a thread here.
    """
    if not (forked_by_main_thread and _arm_death_signal(signum)):
        _watch_parent(parent, signum)
    if parent_gone(parent):
        os.kill(os.getpid(), signum)


def parent_gone(parent: int | None) -> bool:
    """Whether this process's parent has died: it is no longer `parent`, or, that unknown, this
    process was reparented to init."""
    current = os.getppid()
    return current != parent if parent is not None else current == 1


def _arm_death_signal(signum: int) -> bool:
    """Ask Linux for `signum` when the parent dies (prctl); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int | None, signum: int) -> None:
    """Where prctl cannot do it: a daemon thread that ends this process once the parent is
    gone, looking every PARENT_POLL_S seconds."""
    if parent is None:
        parent = os.getppid()

    def watch() -> None:
        while not parent_gone(parent):
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()

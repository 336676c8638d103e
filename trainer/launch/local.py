"""Start one process per local rank through torch's own launcher (torchrun's `run`), and make
a process end with the one that started it (`end_with_parent`): torch starts each rank in a
session of its own, so nothing else stops a rank whose launcher was killed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

# The launching process's pid, for its ranks' check that it is still there (`end_with_parent`).
LAUNCHER_PID_ENV = "MCORE_RECIPES_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # how often the watcher thread (no prctl) looks at the parent


def launch_local_ranks(
    nprocs: int, script: Path, script_args: list[str], environment: dict[str, str]
) -> int:
    """Run `script` on `nprocs` local ranks (free rendezvous port); returns the exit code
    (128 + the signal when this process was stopped by one: torch passes it to the ranks and
    waits for them, TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds at most).

    `environment` (from the plugins, e.g. threads per CPU rank) is set before torchrun reads it,
    unless the user set the variable already, and removed again when the ranks are done.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from trainer.launch.agent import quiet_elastic_logs, rank_death_line, rank_exits

    added = [key for key in environment if key not in os.environ]
    os.environ.update({key: environment[key] for key in added})
    outer_pid = os.environ.get(LAUNCHER_PID_ENV)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # always this process's: the ranks' parent
    # A failed rank has printed its own one-line reason; the launcher's report would repeat it.
    quiet_elastic_logs()
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nprocs}", str(script), *script_args]
    )
    try:
        run(args)
    except SignalException as stop:  # Ctrl-C or SIGTERM: torch stopped the ranks (they were
        return 128 + int(stop.sigval)  # given the signal); the caller says it in one line
    except ChildFailedError as failure:
        # Each rank already printed its own one-line error, except one a signal stopped: name
        # it (trainer/launch/agent.py's line); the exit code is passed on.
        line = rank_death_line(rank_exits(failure, 0))
        if line:
            print(line, file=sys.stderr, flush=True)
        codes = [f.exitcode for f in failure.failures.values() if f.exitcode]
        return max((code for code in codes if code > 0), default=1)
    finally:
        for key in added:
            os.environ.pop(key, None)
        restore_variable(LAUNCHER_PID_ENV, outer_pid)
    return 0


def restore_variable(key: str, value: str | None) -> None:
    """Set `key` back to `value`, or remove it when it was not set."""
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


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

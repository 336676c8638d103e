"""Start one process per local rank through torch's own launcher (torchrun's `run`), telling
the ranks this process's pid (`LAUNCHER_PID_ENV`): torch starts each rank in a session of its
own, so a rank ends with its launcher only by watching it (`trainer/parent_watch.py`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The launching process's pid, for its ranks' check that it is still there (`end_with_parent`).
LAUNCHER_PID_ENV = "MCORE_RECIPES_LAUNCHER_PID"


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

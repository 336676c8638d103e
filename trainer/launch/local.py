"""Start one process per local rank through torch's own launcher (torchrun's `run`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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
    return 0

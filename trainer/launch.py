"""Start one process per local rank through torch's own launcher (torchrun's `run`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def under_launcher() -> bool:
    """True inside a rank started by torchrun, Slurm+torchrun or our own self-launch."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_local_ranks(nprocs: int, script: Path, script_args: list[str], threads: int) -> int:
    """Run `script` on `nprocs` local ranks (free rendezvous port); returns the exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    # Set before torchrun reads it, so it does not warn and so ranks do not oversubscribe cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # A failed rank has printed its own one-line reason; the launcher's report would repeat it.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nprocs}", str(script), *script_args]
    )
    try:
        run(args)
    except ChildFailedError as failure:
        # Each rank already printed its own one-line error; only the exit code is left to pass on.
        codes = [f.exitcode for f in failure.failures.values() if f.exitcode]
        return max(codes, default=1)
    return 0

"""A test-only rank entry: scripts/pretrain.py, except that the rank named by DIE_RANK is
SIGKILLed just before its step DIE_AT_STEP (the way the kernel's OOM killer or a lost node
stops a rank: no Python unwinding, no report), after writing the time to DIE_STAMP if set;
with DIE_HOW=raise it raises a ValueError there instead (a rank's own failure).
HANG_RANK, if set, names a rank that instead sleeps at that step, as an NCCL rank waiting
for a dead peer does. Product code has no hook for this; the patch replaces the step function
the training loop calls, on those ranks only.

    DIE_RANK=1 DIE_AT_STEP=2 torchrun ... tests/dist/die_at_step.py <pretrain.py arguments>
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def patch_step(rank: int, die_rank: int, hang_rank: int | None, at_step: int) -> None:
    import trainer.loop

    step = trainer.loop.run_step

    def die_or_hang(session, *args):
        if session.state.step + 1 == at_step:  # state.step: the steps already done
            if rank == hang_rank:
                time.sleep(120)  # its agent must stop it first; woken, it kills itself below
            if stamp := os.environ.get("DIE_STAMP"):
                Path(stamp).write_text(str(time.time()))
            if os.environ.get("DIE_HOW") == "raise":
                raise ValueError(f"rank {rank} fails by its own exception at step {at_step}")
            os.kill(os.getpid(), signal.SIGKILL)
        return step(session, *args)

    if rank in (die_rank, hang_rank):
        trainer.loop.run_step = die_or_hang


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    hang = os.environ.get("HANG_RANK")
    patch_step(int(os.environ.get("RANK", "0")), int(os.environ.get("DIE_RANK", "1")),
               int(hang) if hang else None, int(os.environ.get("DIE_AT_STEP", "2")))
    sys.argv[0] = str(REPO / "scripts" / "pretrain.py")
    runpy.run_path(sys.argv[0], run_name="__main__")

"""Check, before a long job, that a recipe resumes exactly on this machine or cluster.

usage: python scripts/validate_resume.py [recipe=NAME | config=FILE] [overrides] [steps=N]
                                         [save_at=K]

    python scripts/validate_resume.py                          # the default CPU-sized recipe
    python scripts/validate_resume.py recipe=tiny_pp2_vpp2 steps=8 save_at=4
    torchrun --nnodes 2 --nproc-per-node 8 ... scripts/validate_resume.py recipe=8b_tp8_pp4_dp2

Trains `steps` steps without stopping, saving a full checkpoint after step `save_at`, then starts
a new training session from that checkpoint and trains to `steps` again. Prints a pass/fail
table (loss, learning rate, consumed tokens, data order, RNG streams), compared bit for bit on
every rank; exits 0 when every check passes, 1 otherwise (the checkpoint is then kept under
<run_dir>/validate_resume for inspection). Without torchrun it launches its own local ranks.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import VALIDATE_RESUME  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # the checkpoint writer spawns processes: keep this guard
    sys.exit(main(VALIDATE_RESUME))

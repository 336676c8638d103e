"""Scaling efficiency: run one recipe at several world sizes and report whether it paid off.

usage: python scripts/scaling.py [recipe=NAME | config=FILE] scaling.world_sizes=[1,2,4]
           scaling.mode=weak|strong [scaling.steps=N] [scaling.cluster=FILE]
           [scaling.token_budget=TOKENS] [scaling.out=DIR] [section.field=value ...]
           [cluster=FILE [executor=slurm|local] [--dry-run] [account=A partition=P ...]]
       python scripts/scaling.py scaling.report=DIR

    python scripts/scaling.py recipe=tiny_dp1 scaling.world_sizes=[1,2,4] scaling.mode=weak
    python scripts/scaling.py recipe=tiny_dp1 scaling.world_sizes=[1,2,4] scaling.mode=strong \\
        train.global_batch_size=16
    python scripts/scaling.py recipe=8b_tp8_pp4_dp2 scaling.world_sizes=[32,64] \\
        data.source=blend data.blend=conf/data/<blend>.yaml \\
        cluster=conf/cluster/h100_80gb_8x8.yaml account=A partition=batch
    python scripts/scaling.py scaling.report=runs/scaling-8b_tp8_pp4_dp2-weak-<time>

With cluster=FILE each size is submitted as a job through scripts/launch.py's NeMo-Run path
(the same options: executor, account, partition, time, job_dir, ...; --dry-run prints each
job's script), its run directory inside the sweep directory on shared storage; once the jobs
have finished, scaling.report=DIR writes the report.

Each size is a pretrain run on local ranks (the recipe's TP x PP x CP kept, DP grown). weak:
per-replica batch fixed; strong: global batch fixed. scaling.steps (default 8): 1 warm-up, 2
profiled (exposed communication), the rest measured. scaling.cluster names a conf/cluster file
whose peak gives MFU (otherwise MFU is unknown). Writes report.txt, report.json,
throughput.png and efficiency.png to scaling.out (default runs/scaling-<recipe>-<mode>-<time>).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import SCALING  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(SCALING))

"""Launch a recipe on a Slurm cluster (or this machine) as a NeMo-Run experiment.

usage: python scripts/launch.py recipe=NAME cluster=conf/cluster/<name>.yaml
           [executor=slurm|local] [--dry-run] [account=A] [partition=P] [time=T]
           [retries=N] [rdzv_port=N] [job_dir=DIR] [container_image=IMAGE]
           [section.field=value ...]

    python scripts/launch.py recipe=8b_tp8_pp4_dp2 cluster=conf/cluster/h100_80gb_8x8.yaml \\
        data.source=blend data.blend=conf/data/<blend>.yaml --dry-run
    python scripts/launch.py recipe=8b_tp8_pp4_dp2 cluster=conf/cluster/h100_80gb_8x8.yaml \\
        data.source=blend data.blend=conf/data/<blend>.yaml account=my_account \\
        partition=batch time=04:00:00 retries=2
    python scripts/launch.py recipe=tiny_dp2 cluster=conf/cluster/cpu_local.yaml executor=local

executor=slurm (default) renders an sbatch script through nemo_run.SlurmExecutor and its
torchrun launcher: nodes = the recipe's ranks / the cluster's GPUs per node, one torchrun per
node, a c10d rendezvous on the allocation's first node (port rdzv_port=N, 1024-65535, default
one in 20000-29999 derived from the experiment name and launch time), `sbatch --requeue`
(retries=N requeues a failed job N times) and submits it; --dry-run prints the script instead.
The job's run directory is fixed at launch (<job_dir>/runs/<recipe>-<UTC time>, or run_dir=)
and runs with checkpoint.resume=true, so a requeued job continues from its newest checkpoint.
executor=local runs torchrun on this machine through nemo_run.LocalExecutor. Both put
scripts/agent (our torchrun agent) first on PATH. The recipe and overrides are checked as
pretrain.py checks them before anything is submitted. Needs the `launch` extra.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import LAUNCH  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(LAUNCH))

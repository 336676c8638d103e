"""Starting ranks: on this machine (`local`), under torch's launcher with one-line fault reports
(`agent`, the `torchrun` the cluster jobs run), and as NeMo-Run jobs on Slurm (`cluster`)."""

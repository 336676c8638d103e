"""Plan a recipe before launch: memory per GPU, placement on nodes, communication, bubble, batch.

usage: python scripts/plan.py [recipe=NAME | config=FILE] [cluster=FILE] [option=value ...]
                              [section.field=value ...] [--json]

    python scripts/plan.py recipe=8b_tp8_pp4_dp2 cluster=conf/cluster/h100_80gb_8x8.yaml
    python scripts/plan.py recipe=llama3_8b_tp8_dp8 sharding=optim_grads_params --json
    python scripts/plan.py recipe=llama31_405b_tp8_pp16_dp128 tokens=15.6e12 verify=true
    python scripts/plan.py recipe=tiny_tp2_pp2 cluster=conf/cluster/cpu_local.yaml

options (besides the recipe's own section.field=value overrides):
  cluster=FILE      conf/cluster/*.yaml: GPUs per node, memory, bandwidths, peak TFLOP/s
                    (default: the recipe's cluster section with the H100 file's network)
  sharding=         none | dist_opt | optim | optim_grads | optim_grads_params
                    (default: dist_opt with optimizer.distributed=true, else none)
  offload=true      optimizer state (FP32 master, Adam moments) in CPU memory
  attention=        flash | explicit (default: the cluster file's)
  fp8_weights=true  FP8 training that keeps FP8 weights (default: BF16 weights)
  tokens=N          token budget: steps and GPU-hours (e.g. 15e12)
  mfu=F             share of peak FLOP/s for the step-time estimate (default 0.4)
  groups=N          write out at most N groups of each kind in the text (default: all)
  verify=true       also build every distinct shard on the meta device and compare
  --json            the same plan as one JSON object (bytes exact)

A mistake prints `error: <one line>` and exits with code 2. See docs/planner.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.plan.command import run_plan  # noqa: E402
from trainer.entry.pipeline import Command, main  # noqa: E402


def _no_ranks(*_args) -> int:  # the planner runs in this process (Command.local)
    raise RuntimeError("scripts/plan.py starts no ranks")


def _dry_run_shards(cfg):  # verify=true: the real model of every distinct shard, on meta
    from trainer.tools.dry_run import collect_shards

    return collect_shards(cfg)


PLAN = Command(script=Path(__file__), help=__doc__, run_rank=_no_ranks,
               local=lambda argv: run_plan(argv, build_shards=_dry_run_shards))

if __name__ == "__main__":
    sys.exit(main(PLAN))

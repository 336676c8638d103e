"""Plan a recipe before launch: memory per GPU, placement on nodes, communication, bubble, batch.

usage: python scripts/plan.py [recipe=NAME | config=FILE] [cluster=FILE] [option=value ...]
                              [section.field=value ...] [--json]

    python scripts/plan.py recipe=8b_tp8_pp4_dp2 cluster=conf/cluster/h100_80gb_8x8.yaml
    python scripts/plan.py recipe=llama3_8b_tp8_dp8 sharding=optim_grads_params --json
    python scripts/plan.py recipe=llama31_405b_tp8_pp16_dp128 tokens=15.6e12 verify=true
    python scripts/plan.py recipe=tiny_tp2_pp2 cluster=conf/cluster/cpu_local.yaml
    python scripts/plan.py recipe=tiny_tp2_pp2 cluster=conf/cluster/cpu_local.yaml search=true
    python scripts/plan.py megatron_args=launch.sh cluster=conf/cluster/h100_80gb_8x8.yaml

The planner's options are listed below, besides the recipe's own section.field=value
overrides; --json prints the same plan as one JSON object (bytes exact). A mistake prints
`error: <one line>` and exits with code 2. See docs/planner.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import PLAN  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(PLAN))

"""Pretrain a model with Megatron Core from a named recipe: a GPT, dense or MoE, or a hybrid
Mamba-Transformer (every family is in the recipe list below).

usage: python scripts/pretrain.py [recipe=NAME | config=FILE] [section.field=value ...]

    python scripts/pretrain.py                                  # default CPU-sized recipe
    python scripts/pretrain.py recipe=list                      # every recipe, one line each
    python scripts/pretrain.py recipe=8b_tp8_pp4_dp2 dry_run=true
    python scripts/pretrain.py recipe=tiny_tp2_pp2 train.train_iters=50 optimizer.lr=1e-3
    python scripts/pretrain.py config=runs/<run>/config.yaml    # reproduce a saved run
    python scripts/pretrain.py checkpoint.load=runs/<run>/checkpoints   # resume a run
    python scripts/pretrain.py recipe=llama3_8b_tp8_dp8 print=megatron_args   # as Megatron-LM

Without torchrun it launches its own local ranks; under torchrun it runs as the rank it is.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import PRETRAIN  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # the checkpoint writer spawns processes: keep this guard
    sys.exit(main(PRETRAIN))

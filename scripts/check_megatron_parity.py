"""Check that this trainer trains a recipe exactly as Megatron-LM's own loop does: GPT recipes,
dense or MoE, through pretrain_gpt.py's path; hybrid recipes through pretrain_hybrid.py's, with
this project's stack spec (the Mamba mixer's conv width and chunk size have no Megatron-LM
flag). Packed documents, phases and a batch ramp-up are refused before any rank starts.

usage: python scripts/check_megatron_parity.py [recipe=NAME | config=FILE] [overrides] [steps=N]

    python scripts/check_megatron_parity.py recipe=tiny_dp1 steps=20
    python scripts/check_megatron_parity.py recipe=tiny_tp2_pp2 steps=5
    python scripts/check_megatron_parity.py recipe=hybrid_tiny_dp1 steps=20

Trains N steps (default 20) with this trainer, then N steps with Megatron-LM's
`megatron.training.pretrain` (from the installed wheel; on CPU through the CPU runtime) from the
same initial weights on the same batches, with Megatron-LM's command line built from the recipe
(`pretrain.py print=megatron_args`) plus the flags that align the settings where the two differ
on purpose (printed). Prints per step the loss, grad norm and learning rate and their
differences, and the final weights' largest difference; exits 0 when everything is
bit-identical, 1 otherwise (docs/megatron-lm.md). Without torchrun it launches its own ranks.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import CHECK_MEGATRON_PARITY  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # the checkpoint writer spawns processes: keep this guard
    sys.exit(main(CHECK_MEGATRON_PARITY))

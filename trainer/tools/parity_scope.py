"""What `scripts/check_megatron_parity.py` can compare, as one rule without torch: the launching
process checks it before any rank starts (`trainer/entry/commands.py`), so a recipe the check
cannot run is refused in about a second, not after every rank has built its model.
"""

from __future__ import annotations

from recipes.config.schema import RunConfig


def unsupported(cfg: RunConfig) -> str | None:
    """What the check cannot compare, as one line (None: it can): its `get_batch` is
    `pretrain_gpt.py`'s (and `pretrain_hybrid.py`'s) for plain batches, and Megatron-LM's loop
    trains one phase at one batch size."""
    if cfg.data.documents != "concatenate":
        return (f"check_megatron_parity feeds plain batches; data.documents="
                f"{cfg.data.documents} makes packed ones; set data.documents=concatenate")
    if cfg.phases or cfg.train.rampup_batch_size:
        return ("check_megatron_parity runs one phase at one batch size; drop phases and "
                "train.rampup_batch_size")
    return None

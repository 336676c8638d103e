"""Layer kinds: the unit in which every family's parameter, FLOPs and activation terms are
counted, named by Megatron Core's hybrid-pattern symbols. A GPT layer is an attention and an
MLP (or MoE) sublayer; a hybrid model names each layer's kind in its pattern.
"""

from __future__ import annotations

from typing import Any

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
LAYER_SYMBOLS = (MAMBA, ATTENTION, MLP, MOE)
SYMBOL_NAMES = {MAMBA: "Mamba2", ATTENTION: "attention", MLP: "MLP", MOE: "MoE"}


def gpt_layer_kinds(model: Any) -> tuple[str, str]:
    """The two sublayers of every layer of a GPT model: attention, then an MLP or MoE."""
    return ATTENTION, MOE if model.num_moe_experts else MLP

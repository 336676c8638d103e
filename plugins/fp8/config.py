"""Config of the FP8 plugin (torch-free): which FP8 format Transformer Engine trains in.

FP8 is a plugin, not a core precision field: it is optional and GPU-only, needs Transformer
Engine, brings rules of its own (GEMM dimensions divisible by 16; more with each FP8 recipe)
and changes the run only through the transformer config. `precision.dtype` stays core: every
run has one, and Megatron's optimizer, DDP and Float16Module all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from plugins.protocol import Plugin, PluginConfig, Rule

FP8_MULTIPLE = 16  # Transformer Engine FP8 GEMMs need every matrix dimension divisible by 16


def check_fp8_shapes(cfg: Any) -> str | None:
    """FP8 GEMMs need hidden, MLP and per-rank token dimensions that are multiples of 16."""
    if cfg.plugins.fp8.format is None:
        return None
    m, p = cfg.model, cfg.parallel
    sp_split = p.tensor if p.sequence_parallel else 1
    tokens = m.seq_length // (p.context * sp_split) * cfg.train.micro_batch_size
    dims = {
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "tokens per rank per micro-batch (seq_length / CP [/ TP with SP] x micro_batch_size)": (
            tokens
        ),
    }
    for name, value in dims.items():
        if value is not None and value % FP8_MULTIPLE:
            return (
                f"plugins.fp8.format={cfg.plugins.fp8.format} needs {name} divisible by "
                f"{FP8_MULTIPLE}, got {value}; adjust it or set plugins.fp8.format=null"
            )
    return None


@dataclass(kw_only=True)
class Fp8Config(PluginConfig):
    """FP8 training through Transformer Engine (GPU only)."""

    format: Literal["hybrid", "e4m3"] | None = None  # FP8 recipe format; None = off

    def rules(self) -> tuple[Rule, ...]:
        return (check_fp8_shapes,)

    def build(self) -> Plugin | None:
        if self.format is None:
            return None
        from plugins.fp8.plugin import Fp8Plugin

        return Fp8Plugin(self.format)

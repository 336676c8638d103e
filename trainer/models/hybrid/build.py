"""The hybrid family's model: its stack spec (`spec.py`) and Megatron Core's `HybridModel`."""

from __future__ import annotations

from typing import Any

from megatron.core.models.hybrid.hybrid_model import HybridModel
from megatron.core.transformer import TransformerConfig

from recipes.config.schema import RunConfig
from trainer.mcore_translation import position_fields
from trainer.models.hybrid.spec import hybrid_stack_spec


def layer_spec(cfg: RunConfig, config: TransformerConfig, vp_stage: int | None,
               transformer_engine: bool) -> Any:
    """The stack spec for this rank's layers (Megatron picks each chunk's layers itself)."""
    return hybrid_stack_spec(cfg, transformer_engine=transformer_engine)


def model_chunk(cfg: RunConfig, config: TransformerConfig, spec: Any, vp_stage: int | None,
                **ends: bool) -> HybridModel:
    """A HybridModel chunk: Megatron picks this chunk's '|' segment (or even share) itself."""
    return HybridModel(
        config=config,
        hybrid_stack_spec=spec,
        vocab_size=cfg.layout.padded_vocab,
        max_sequence_length=cfg.model.seq_length,
        hybrid_layer_pattern=cfg.model.hybrid_layer_pattern,
        share_embeddings_and_output_weights=cfg.model.share_embeddings_and_output_weights,
        **position_fields(cfg),
        vp_stage=vp_stage,
        **ends,
    )

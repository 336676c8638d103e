"""The GPT family's model: Megatron Core's decoder-block spec and `GPTModel`.

A block spec (not a single layer spec) so the final norm is part of the spec too and the CPU
runtime and the plugins can swap every module, e.g. the sequence-parallel torch norm on CPU.
"""

from __future__ import annotations

from typing import Any

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer import TransformerConfig

from recipes.config.schema import RunConfig
from trainer.mcore_translation import position_fields


def layer_spec(cfg: RunConfig, config: TransformerConfig, vp_stage: int | None,
               transformer_engine: bool) -> Any:
    """This chunk's decoder-block spec: Transformer Engine's layers or the local ones."""
    return get_gpt_decoder_block_spec(
        config,
        use_transformer_engine=transformer_engine,
        normalization=cfg.model.normalization,
        vp_stage=vp_stage,
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
    )


def model_chunk(cfg: RunConfig, config: TransformerConfig, spec: Any, vp_stage: int | None,
                **ends: bool) -> GPTModel:
    """One `GPTModel` chunk (`ends`: pre_process, post_process) built from `spec`."""
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=cfg.layout.padded_vocab,
        max_sequence_length=cfg.model.seq_length,
        share_embeddings_and_output_weights=cfg.model.share_embeddings_and_output_weights,
        **position_fields(cfg),
        rope_scaling=cfg.model.rope_scaling_factor is not None,
        rope_scaling_factor=cfg.model.rope_scaling_factor or 8.0,
        vp_stage=vp_stage,
        **ends,
    )

"""Context parallelism at the trainer's hooks: Megatron's CP comm type, and each micro-batch cut
to this CP rank's load-balanced chunks.

The split is Megatron Core's own `get_batch_on_this_cp_rank` (`core/utils.py:2612-2665`):
without `cu_seqlens` it keeps chunks r and 2·CP−1−r of every sequence; with them (packed rows)
it does the same per document, through Transformer Engine's `thd_get_partitioned_indices`. The
model's RoPE picks the same chunks of its table (`models/common/embeddings/
rotary_pos_embedding.py:199-204`), and attention then needs every CP rank's keys: Transformer
Engine's attention exchanges them by `cp_comm_type` on GPU; on CPU the CPU runtime's reference
attention gathers them (`trainer/cpu_runtime/cp_attention.py`).

Losses need nothing extra: each CP rank sums the loss of its own tokens, the trainer reduces
sums and token counts over the world (`trainer/metrics.py`), and Megatron's DDP reduces
gradients over DP x CP.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron.core import parallel_state
from megatron.core.utils import get_batch_on_this_cp_rank

from plugins.protocol.errors import UserError
from plugins.protocol.hooks import Plugin


def _require_hierarchical_groups() -> None:
    """Without Megatron's hierarchical CP groups TE gets no CP group for a2a+p2p and each rank
    would attend only within its own chunks: silently wrong, so refused."""
    groups = parallel_state.get_hierarchical_context_parallel_groups(check_initialized=False)
    if not groups:
        raise UserError(
            "plugins.context_parallel.comm_type=a2a+p2p but Megatron's hierarchical context-"
            "parallel groups were not created (initialize_model_parallel got no "
            "hierarchical_context_parallel_sizes); set plugins.context_parallel."
            "hierarchical_sizes, or use comm_type=p2p")


class ContextParallelPlugin(Plugin):
    def __init__(self, config: Any) -> None:  # the plugin's ContextParallelConfig
        self.config = config

    def transformer_config(self, config: Any) -> Any:
        if config.context_parallel_size == 1:  # a meta-device model is built with CP 1
            return config
        if self.config.comm_type == "a2a+p2p":
            _require_hierarchical_groups()
        sizes = self.config.hierarchical_sizes
        return dataclasses.replace(
            config,
            cp_comm_type=self.config.comm_type,
            hierarchical_context_parallel_sizes=list(sizes) if sizes else None,
        )

    def microbatch(self, batch: dict[str, Any]) -> dict[str, Any]:
        if parallel_state.get_context_parallel_world_size() == 1:
            return batch
        batch = dict(batch)  # Megatron's split replaces entries in place
        if "cu_seqlens" in batch:
            # The per-document split reads padded boundaries with a leading batch dim.
            padded = batch.get("cu_seqlens_padded", batch["cu_seqlens"])
            batch["cu_seqlens_padded"] = padded.reshape(1, -1)
        return get_batch_on_this_cp_rank(
            batch, is_hybrid_cp=False, cp_group=parallel_state.get_context_parallel_group()
        )

"""Per-rank checks of the context-parallel split, run by tests/dist/test_context_parallel.py:
each CP rank cuts a batch with the CP plugin (Megatron Core's `get_batch_on_this_cp_rank`) and
returns the positions it kept; the tests decide what is right.

Entry: `tests.dist.cp_checks:split_positions` with payload
`{"cp": int, "length": int, "bounds": [padded document bounds] | null, "skip": [patches]}`.
"""

from __future__ import annotations

from typing import Any

import torch

from plugins.context_parallel.config import ContextParallelConfig
from trainer.cpu_runtime.runtime import activate_cpu_runtime


def _batch(length: int, bounds: list[int] | None) -> dict[str, torch.Tensor]:
    row = torch.arange(length)[None]
    batch = {"tokens": row.clone(), "labels": row + 1, "loss_mask": torch.ones(1, length),
             "position_ids": row.clone()}
    if bounds is not None:
        batch["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32)
        lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        batch["max_seqlen"] = torch.tensor(max(lengths))
    return batch


def split_positions(payload: dict[str, Any]) -> dict[str, Any]:
    """This CP rank's kept positions (from `tokens`), or the error the split raised."""
    activate_cpu_runtime(skip=frozenset(payload.get("skip", ())))
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(context_parallel_size=payload["cp"])
    try:
        plugin = ContextParallelConfig().build()
        split = plugin.microbatch(_batch(payload["length"], payload.get("bounds")))
        kept = split["tokens"].reshape(-1)
        assert torch.equal(split["labels"].reshape(-1), kept + 1)  # every key cut alike
        return {"cp_rank": parallel_state.get_context_parallel_rank(), "positions": kept.tolist()}
    except Exception as error:  # reported; the test decides whether it should have failed
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        parallel_state.destroy_model_parallel()

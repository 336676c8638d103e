"""A weights-only checkpoint of a session's model: the reference the equivalence tests start
every layout from (`checkpoint.load=<dir> checkpoint.load_model_only=true`), written as the
trainer writes the model part of a full checkpoint."""

from __future__ import annotations

from pathlib import Path


def save_model_weights(directory: str | Path, cfg, model: list) -> Path:
    """Weights only (no optimizer), under global names: any layout loads them."""
    import torch
    from megatron.core import dist_checkpointing

    from trainer.checkpoint.megatron_fixes import in_process_write_results
    from trainer.checkpoint.state_dicts import content_metadata, model_sharded_state_dict

    path = Path(directory)
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    metadata = content_metadata(cfg)
    with in_process_write_results():
        dist_checkpointing.save(model_sharded_state_dict(model, metadata), str(path),
                                content_metadata=metadata)
    torch.distributed.barrier()
    return path

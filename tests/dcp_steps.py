"""A torch DCP step written in one process (no process group): two tensors and Megatron's
`metadata.json`, the layout a step without `run.json` (Megatron-LM's, Megatron Bridge's) has,
minus its bookkeeping. Its `.metadata` index places every byte, which the pre-flight checks
(`trainer/checkpoint/megatron_lm.py` `unchecked_damage`)."""

from __future__ import annotations

from pathlib import Path


def dcp_step(path: Path) -> Path:
    import torch
    import torch.distributed.checkpoint as dcp

    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    state = {"a": torch.arange(4096.0), "b": torch.ones(64, 64)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return path

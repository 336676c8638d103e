"""Where this rank computes: its CUDA device on GPU nodes, the CPU under the CPU runtime."""

from __future__ import annotations

import torch


def compute_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_compute_device(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    device = compute_device()
    if device.type == "cpu":
        return batch
    # Non-tensor values (e.g. a packed batch's max_seqlen as an int) stay on the host.
    return {
        key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }

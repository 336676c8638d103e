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
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}

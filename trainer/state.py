"""Typed run state: everything besides weights, optimizer and scheduler that a resume needs.

`RunState` is what a checkpoint saves and loads as a whole (trainer/checkpoint/): the step,
samples and loss tokens consumed, the training data position, this rank's RNG streams, and
each plugin's own state. Adding a field here adds it to every checkpoint; no save or load
signature changes. `RunHistory` is what the loop records for the summary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from megatron.core.tensor_parallel import get_cuda_rng_tracker


@dataclass
class RngState:
    """This rank's random streams: Python, NumPy, torch (CPU, CUDA) and Megatron's tracker,
    whose named streams draw dropout inside and outside tensor-parallel regions."""

    python: tuple
    numpy: tuple
    torch_cpu: torch.Tensor
    torch_cuda: torch.Tensor | None
    tracker: dict[str, torch.Tensor]

    @classmethod
    def capture(cls) -> RngState:
        return cls(
            python=random.getstate(),
            numpy=np.random.get_state(),
            torch_cpu=torch.get_rng_state(),
            torch_cuda=torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            tracker={name: state.clone() for name, state in
                     get_cuda_rng_tracker().get_states().items()},
        )

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(self.torch_cuda)
        get_cuda_rng_tracker().set_states(self.tracker)

    def as_dict(self) -> dict[str, Any]:
        """Tensors, numbers, strings and containers only, so a checkpoint loads it with
        `torch.load(weights_only=True)` (NumPy's key array becomes a list of ints)."""
        name, keys, *rest = self.numpy
        return {"python": self.python, "numpy": (name, keys.tolist(), *rest),
                "torch_cpu": self.torch_cpu, "torch_cuda": self.torch_cuda,
                "tracker": self.tracker}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RngState:
        name, keys, *rest = values["numpy"]
        numpy_state = (name, np.asarray(keys, dtype=np.uint32), *rest)
        return cls(**{**values, "numpy": numpy_state})

    def as_megatron_lm(self) -> dict[str, Any]:
        """The streams under Megatron-LM's names (`training/checkpointing.py:409-415`), which
        its load restores unconditionally, the CUDA generator's included (on a CPU rank the
        CPU runtime's CUDA generator is the CPU one)."""
        return {"random_rng_state": self.python, "np_rng_state": self.numpy,
                "torch_rng_state": self.torch_cpu,
                "cuda_rng_state": self.torch_cpu if self.torch_cuda is None else self.torch_cuda,
                "rng_tracker_states": self.tracker}

    @classmethod
    def from_megatron_lm(cls, values: dict[str, Any]) -> RngState:
        """Streams Megatron-LM saved (its names; NumPy's key array as saved)."""
        name, keys, *rest = values["np_rng_state"]
        return cls(python=values["random_rng_state"],
                   numpy=(name, np.asarray(keys, dtype=np.uint32), *rest),
                   torch_cpu=values["torch_rng_state"],
                   torch_cuda=values.get("cuda_rng_state") if torch.cuda.is_available() else None,
                   tracker=dict(values["rng_tracker_states"]))


@dataclass
class RunState:
    """Where a run stands after `step` optimizer steps; saved and loaded as one object."""

    step: int = 0  # optimizer steps done
    consumed_samples: int = 0  # training samples of all global batches so far
    consumed_tokens: int = 0  # loss tokens of those batches, each counted once
    skipped_steps: int = 0  # of those steps, updates the optimizer skipped (fp16 overflow)
    # The training data's position (each phase stream's, in samples) and tokens per source.
    data: dict[str, Any] = field(default_factory=dict)
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)  # each plugin's own state
    world_size: int = 1  # ranks of the run that saved it (RNG streams are per rank)
    rng: RngState | None = None  # this rank's streams; per rank in the checkpoint

    def advance(self, samples: int) -> None:
        """Count one optimizer step of `samples` samples. As in Megatron-LM, a step whose update
        was skipped (fp16 overflow) still counts and consumes its batch; `skip` marks it."""
        self.step += 1
        self.consumed_samples += samples

    def count_tokens(self, loss_tokens: int) -> None:
        """Add a step's loss tokens once its figures are summed over the world (the loop sums
        them before every checkpoint, so a saved state has every step's tokens)."""
        self.consumed_tokens += loss_tokens

    def skip(self) -> None:
        """Mark the step just counted as one whose update the optimizer skipped."""
        self.skipped_steps += 1

    def common(self) -> dict[str, Any]:
        """The part every rank shares (saved once)."""
        return {"step": self.step, "consumed_samples": self.consumed_samples,
                "consumed_tokens": self.consumed_tokens, "skipped_steps": self.skipped_steps,
                "data": dict(self.data), "plugins": dict(self.plugins),
                "world_size": self.world_size}

    @classmethod
    def from_common(cls, values: dict[str, Any], rng: RngState | None) -> RunState:
        return cls(**values, rng=rng)


@dataclass
class RunHistory:
    """What the loop saw, for the summary: first/last loss, held-out losses, step times."""

    first_loss: float | None = None
    final_loss: float | None = None
    heldout: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    step_times: list[tuple[float, int]] = field(default_factory=list)  # (seconds, loss tokens)
    step_flops: list[float] = field(default_factory=list)  # each step's useful model FLOPs
    checkpoint: str | None = None  # the last checkpoint written

    def record_step(self, loss: float, seconds: float, loss_tokens: int,
                    model_flops: float = 0.0) -> None:
        if self.first_loss is None:
            self.first_loss = loss
        self.final_loss = loss
        self.step_times.append((seconds, loss_tokens))
        self.step_flops.append(model_flops)

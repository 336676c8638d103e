"""The typed events the trainer hands its plugins at each hook point (`hooks.py`).

Arguments that are Megatron Core or torch objects are typed `Any`: the contract stays torch-free,
so a configuration is resolved and validated before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RuntimeContext:
    """What `setup_runtime` decides for this process; defaults are a CUDA node."""

    dry_run: bool = False  # building shards on the meta device, no training
    backend: str = "nccl"  # default process-group backend
    device: str = "cuda"  # where this rank computes
    cpu_initialization: bool = False  # draw each full weight on CPU, then split (layout-invariant)


@dataclass
class StepMetrics:
    """One optimizer step, as every rank knows it (losses are reduced over the world)."""

    step: int  # optimizer steps done, this one included
    loss: float  # mean loss per loss token of the global batch
    lr: float
    grad_norm: float
    loss_tokens: int  # loss-contributing tokens of the global batch, each counted once
    step_time_s: float
    skipped: bool = False  # the optimizer did not apply this update (e.g. fp16 overflow)
    # Where the step's time went, in seconds, averaged over ranks (trainer/throughput.py).
    data_wait_s: float = 0.0  # taking the next global batch's micro-batches
    forward_backward_s: float = 0.0  # the pipeline schedule over all micro-batches
    optimizer_s: float = 0.0  # the optimizer update and scheduler step
    # Communication not hidden behind compute; only on profiled steps (else None), which
    # state the slowest rank's exposed time and step time.
    exposed_comm_s: float | None = None
    # Useful model FLOPs of the step's trained sequences: full rows, or packed rows' documents
    # (no recompute, no padding; recipes/plan/flops.py `training_flops`).
    model_flops: float = 0.0
    model_tflops_per_gpu: float = 0.0  # model_flops / step time / ranks
    mfu: float | None = None  # model_tflops_per_gpu / peak for the precision; None: no peak
    measured: bool = True  # counted in the run's throughput: after warm-up, not profiled
    # Peak memory of the busiest rank in GiB: device memory allocated on GPU, the process's
    # resident set on CPU ranks. Measured on logged steps only (else None): it costs a
    # collective.
    memory_gib: float | None = None
    # On GPU also the caching allocator's peak reservation (allocated + cached blocks), the
    # busiest rank's, on the same steps; None elsewhere.
    memory_reserved_gib: float | None = None
    # Each pipeline stage's compute seconds (its busiest rank), from the profiled steps only
    # (else None): a stage that computes much longer than the others holds every step up.
    stage_compute_s: list[float] | None = None
    # Which phase of the run (recipes/config/phases.py) trained this step: its number and name.
    phase: int = 0
    phase_name: str = "run"
    global_batch: int = 0  # samples of this step (a phase's batch, or the ramp-up's)
    # Tokens taken so far per blend source (samples x sequence length, every phase together).
    source_tokens: dict[str, int] = field(default_factory=dict)
    # Plugins' own figures of this step, by name (filled in `after_step`; logged with the step).
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """This step's effective tokens/s: the trainer's definition (`trainer.throughput.
        tokens_per_second`, which a plugin cannot import) over a one-step window."""
        return self.loss_tokens / self.step_time_s if self.step_time_s > 0 else 0.0


@dataclass
class EvalResult:
    """One held-out evaluation."""

    step: int  # optimizer steps done when it ran
    loss: float  # mean loss per loss token over the held-out batches
    loss_tokens: int


@dataclass
class RunStart:
    """What a plugin may read when the run begins."""

    config: Any  # the RunConfig
    run_dir: Path
    start_step: int  # 0, or the step a checkpoint resumed from
    total_steps: int
    # Step numbers the trainer runs under torch.profiler itself in this process (to measure
    # exposed communication); torch runs one profiler at a time, so a plugin must avoid them.
    profiled_steps: frozenset[int] = frozenset()

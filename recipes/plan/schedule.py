"""Pipeline schedules: how many micro-batches a stage keeps activations for, and the bubble.

A stage keeps a micro-batch's activations from its forward until its backward. Running every
forward first (GPipe) keeps all of them; 1F1B starts backwards as soon as the last stage can,
so stage i keeps at most PP - i; Megatron's interleaved schedule warms up with
2·(PP - i - 1) + (VPP - 1)·PP chunk forwards before its first backward, each chunk holding
1/VPP of the stage's layers. The bubble is the idle share of the pipeline: (PP - 1) slots of
fill and drain against m micro-batches (m·VPP chunk slots when interleaved).
"""

from __future__ import annotations

from dataclasses import dataclass


def in_flight_all_forward(microbatches: int) -> int:
    """All forwards before any backward: every micro-batch is held on every stage."""
    return microbatches


def in_flight_1f1b(stage: int, pipeline: int, microbatches: int) -> int:
    """Micro-batches stage `stage` holds at its peak under non-interleaved 1F1B."""
    return min(pipeline - stage, microbatches)


def in_flight_chunks_interleaved(stage: int, pipeline: int, virtual: int,
                                 microbatches: int) -> int:
    """Chunk-micro-batches (each 1/VPP of the stage's layers) held at the peak of Megatron's
    interleaved schedule: its warm-up forwards plus the one in the steady state."""
    warmup = (pipeline - stage - 1) * 2 + (virtual - 1) * pipeline
    return min(warmup + 1, microbatches * virtual)


def layer_microbatches_in_flight(stage: int, pipeline: int, virtual: int,
                                 microbatches: int) -> float:
    """Micro-batches' worth of this stage's whole layer stack held at the peak."""
    if pipeline == 1:
        return 1.0
    if virtual == 1:
        return float(in_flight_1f1b(stage, pipeline, microbatches))
    return in_flight_chunks_interleaved(stage, pipeline, virtual, microbatches) / virtual


@dataclass(frozen=True)
class Bubble:
    """Idle share of one optimizer step's pipeline time."""

    slots: int  # idle forward+backward slots per stage (PP - 1)
    work_slots: int  # micro-batch (chunk) slots of work per stage
    fraction_of_ideal: float  # idle / work: (PP-1) / (m·VPP)
    fraction_of_step: float  # idle / (idle + work)


def bubble(pipeline: int, virtual: int, microbatches: int) -> Bubble:
    """Fill-and-drain bubble of 1F1B (virtual=1) and of the interleaved schedule."""
    work = microbatches * virtual
    idle = pipeline - 1
    return Bubble(slots=idle, work_slots=work, fraction_of_ideal=idle / work,
                  fraction_of_step=idle / (idle + work))

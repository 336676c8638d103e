"""Library warnings known to be harmless here, filtered once for every script.

Why: a user reads a command's output to learn what happened. Megatron Core and torch print
warnings meant for other set-ups (no Transformer Engine on a CPU machine, a rank asked of a
process that is none), a dozen of them in a preparation or an export, and a reader cannot tell
them from the one that matters. Each entry below is one such message, where it comes from and
why it is harmless in this project; every other warning still prints. The entry contract
(`contract.main`) applies the table before a command imports anything heavy, and hands the
warnings' part to the processes the command starts (preparation workers, ranks) through
`PYTHONWARNINGS`, which every Python reads at start.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Noise:
    """One harmless message: its start (matched as given), the library file that says it,
    and why it is harmless here. `logger`: said through that logger (else `warnings`)."""

    message: str
    source: str
    why: str
    logger: str | None = None


NOISE = (
    Noise("Could not determine rank from torch.distributed",
          "megatron/core/_rank_utils.py:39 (safe_get_rank, via log_single_rank)",
          "a process that is no rank (data preparation, a blend check, export) reads an "
          "indexed dataset or builds a model; rank 0 is the right answer there"),
    Noise("Transformer Engine and Apex are not installed",
          "megatron/core/optimizer/__init__.py:25, optimizer.py:29, clip_grads.py:32, "
          "distributed/fsdp/src/megatron_fsdp/mixed_precision.py:115",
          "CPU ranks and export use torch's own kernels on purpose; a GPU run without "
          "Transformer Engine is refused before launch (recipes/config/machine.py)"),
    Noise("Apex is not installed. Falling back to Torch Norm",
          "megatron/core/models/backends.py:34, models/gpt/gpt_layer_specs.py:74",
          "the local layer spec (CPU ranks, export) uses torch's norms by design"),
    Noise("full scope is deprecated",
          "megatron/core/transformer/transformer_config.py:2415",
          "said of Megatron's own default cuda_graph_modules; this project captures no CUDA "
          "graphs"),
    Noise("torch.distributed is disabled, unavailable or uninitialized",
          "torch/distributed/checkpoint/utils.py:485",
          "export reads a distributed checkpoint in one process on purpose "
          "(trainer/interop/region_reader.py)"),
    Noise("GPTModel IS DEPRECATED",
          "megatron/core/models/gpt/gpt_model.py:121",
          "GPTModel is Megatron Core 0.19.2's GPT model, which the GPT recipes build; hybrids "
          "use HybridModel", logger="megatron.core.models.gpt.gpt_model"),
    Noise("Only transformer-engine>=1.7.0 supports MoE experts",
          "megatron/core/extensions/transformer_engine_spec_provider.py:88, on importing "
          "megatron/core/models/hybrid/hybrid_layer_specs.py:59 (module-level TE specs)",
          "Megatron-LM's argument module imports the hybrid specs, which build a TE MoE spec "
          "at import; without TE (reading a launch line back, CPU ranks) it is never used: the "
          "project builds its own specs, and a GPU run without TE is refused before launch"),
    Noise("No CUDA runtime is found",
          "torch/utils/cpp_extension.py:178",
          "said on import on every machine without CUDA; the CPU runtime needs none",
          logger="torch.utils.cpp_extension"),
)


class _Drop(logging.Filter):
    """Drops a logger's records that start with one of the known messages."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.starts)


def python_warnings(noise: tuple[Noise, ...] = NOISE) -> str:
    """The `PYTHONWARNINGS` entries that ignore the table's warnings in child processes (a
    literal start of the message each; the form cannot hold a comma, so the text stops
    before one)."""
    return ",".join(f"ignore:{item.message.split(',')[0]}" for item in noise
                    if item.logger is None)


def quiet_known_noise(noise: tuple[Noise, ...] = NOISE) -> None:
    """Filter the table's messages in this process and in those it starts."""
    for item in noise:
        if item.logger is None:
            warnings.filterwarnings("ignore", message=re.escape(item.message))
        else:
            logging.getLogger(item.logger).addFilter(_Drop((item.message,)))
    ours = python_warnings(noise)
    given = os.environ.get("PYTHONWARNINGS")
    if not given or ours not in given:
        os.environ["PYTHONWARNINGS"] = f"{given},{ours}" if given else ours

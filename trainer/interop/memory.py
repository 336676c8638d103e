"""How much memory a conversion holds, from the model's shape, before converting anything.

Why: a user about to convert Llama-3-70B needs to know whether the machine fits it. The figures
are the weights a conversion holds at once; the process adds its libraries on top (measured:
about 0.75 GiB of resident memory for torch + Megatron Core + transformers-free conversion on
CPU, docs/hf-interop.md). Import holds the whole converted model (one `dist_checkpointing.save`
call writes every tensor) plus one Hugging Face tensor group being fused; export holds one
layer as stored, its Hugging Face copy, and the shard being filled.
"""

from __future__ import annotations

from itertools import groupby

import torch

from trainer.interop.mapping import rules
from trainer.models.gpt.hf_tensors import Rule, Shapes, hf_shapes, megatron_shape

# torch, Megatron Core and the conversion code themselves (measured, docs/hf-interop.md).
LIBRARIES_GIB = 0.75


def gib(count: int) -> str:
    return f"{count / 1024**3:.2f} GiB" if count >= 1024**3 else f"{count / 1024**2:.1f} MiB"


def estimate_line(command: str, held: int) -> str:
    """What a conversion is about to hold, said before it starts."""
    return (f"{command}: holds about {gib(held)} of weights at once, plus about "
            f"{LIBRARIES_GIB} GiB for the libraries")


def _numel(shape: tuple[int, ...]) -> int:
    return torch.Size(shape).numel()


def hf_bytes(shapes: Shapes, bytes_per: int) -> int:
    """The Hugging Face model's weights: about the sum of its safetensors shards."""
    return bytes_per * sum(_numel(s) for rule in rules(shapes) for s in hf_shapes(rule, shapes))


def _layer_of(rule: Rule) -> str:
    parts = rule.megatron.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["decoder", "layers"] else rule.megatron


def import_peak(shapes: Shapes, bytes_per: int) -> int:
    """The converted model (vocabulary padded) plus the largest rule's inputs being fused."""
    plan = rules(shapes)
    converted = sum(_numel(megatron_shape(rule, shapes)) for rule in plan)
    inputs = max(sum(_numel(s) for s in hf_shapes(rule, shapes)) for rule in plan)
    return bytes_per * (converted + inputs)


def export_peak(shapes: Shapes, bytes_per: int, max_shard_bytes: int) -> int:
    """The largest load unit (a layer; the embedding or head alone) twice (as stored and as
    its Hugging Face copy) plus one output shard."""
    largest = max(sum(_numel(megatron_shape(rule, shapes)) for rule in group)
                  for _, group in groupby(rules(shapes), key=_layer_of))
    total = hf_bytes(shapes, bytes_per)
    return 2 * bytes_per * largest + min(max_shard_bytes, total)

"""A pure-torch norm that works with sequence parallelism, and the spec rewrite that uses it.

Megatron's `WrappedTorchNorm` refuses sequence parallelism (`transformer/torch_norm.py:50`),
and the Apex/TE norms that support it need CUDA. A norm's computation is the same with or
without SP; what SP changes is that each TP rank sees only part of the sequence, so its weight
grads are partial sums. Apex and TE tag their params `sequence_parallel=True`, and Megatron's
`finalize_model_grads` then all-reduces exactly those grads over TP
(`distributed/finalize_model_grads.py:452`). This module does the same for the torch norm.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch


class SequenceParallelTorchNorm:
    """Drop-in for `WrappedTorchNorm` in a local layer spec (same constructor signature)."""

    def __new__(
        cls,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        # A shallow copy: `dataclasses.replace` would rerun TransformerConfig validation, which
        # rejects some valid SP layouts once SP is off (MoE with TP requires SP).
        config_without_sp = copy.copy(config)
        config_without_sp.sequence_parallel = False
        norm = WrappedTorchNorm(
            config_without_sp,
            hidden_size,
            eps,
            persist_layer_norm,
            zero_centered_gamma,
            normalization,
        )
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def swap_spec_modules(node: Any, module_class: type, replacement: type) -> Any:
    """Copy of a spec tree with every `module_class` (bare or as a ModuleSpec's module) replaced;
    specs are dataclasses nested through fields and lists, shared objects are left untouched.
    Used for the norms here and for the core attention (`packed_attention.py`)."""
    if node is module_class:
        return replacement
    if isinstance(node, list):
        return [swap_spec_modules(item, module_class, replacement) for item in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        swapped = copy.copy(node)
        for spec_field in dataclasses.fields(node):
            value = getattr(node, spec_field.name)
            object.__setattr__(
                swapped, spec_field.name, swap_spec_modules(value, module_class, replacement)
            )
        return swapped
    return node


def adapt_local_layer_spec(spec: Any, config: Any) -> Any:
    """Returns `spec` (a GPT layer spec, layer-spec list, or decoder block spec) with
    `WrappedTorchNorm` replaced by `SequenceParallelTorchNorm` when `config.sequence_parallel`.

    In the local GPT spec (`models/gpt/gpt_layer_specs.py:359-464, 676-719`) the torch norm sits
    at `input_layernorm`, `pre_mlp_layernorm`, the optional q/k layernorms, and the block's
    final `layer_norm`; the fused LayerNorm+linear `linear_qkv`/`linear_fc1` exist only in the
    TE spec, which has SP-capable norms already. Without SP the spec is returned unchanged.
    """
    if not config.sequence_parallel:
        return spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return swap_spec_modules(spec, WrappedTorchNorm, SequenceParallelTorchNorm)

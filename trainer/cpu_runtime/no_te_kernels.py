"""Megatron Core on CPU ranks of a machine where Transformer Engine is installed.

Megatron Core binds some kernels at import: Transformer Engine's when TE imports, else Apex's,
else its own torch code. TE imports without a GPU, so on a CPU rank of such a machine (a GPU
container on a login node, `cluster.device=cpu` beside a GPU) Megatron runs CUDA kernels that
no layer spec chooses: the optimizer's `FusedAdam`/`FusedSGD` and multi-tensor kernels
(`optimizer/__init__.py:13-35`, `optimizer/clip_grads.py:10-47`, `optimizer/optimizer.py:17-35`,
`optimizer/distrib_optimizer.py:20-35`), failing at the first step's gradient norm
(`clip_grads.py:116`: "CUDA driver version is insufficient"), and the MoE router's logits GEMM
(`transformer/moe/moe_utils.py:1326`, bound at `:28-53`), failing in the first forward. Here
each of those names is bound to what Megatron binds when neither TE nor Apex is installed, so a
CPU rank runs the same code, and trains the same numbers, with or without TE.
"""

from __future__ import annotations

import importlib

import torch


def _fallbacks() -> dict[str, dict[str, object]]:
    """Module -> name -> Megatron's own binding without TE and Apex (the `except ImportError`
    or `else` branches of the modules named in the docstring)."""
    from megatron.core.utils import (
        local_multi_tensor_applier,
        local_multi_tensor_l2_norm,
        local_multi_tensor_scale,
    )

    kernels = {"multi_tensor_applier": local_multi_tensor_applier,
               "multi_tensor_scale_impl": local_multi_tensor_scale}
    return {
        "megatron.core.optimizer": {"Adam": torch.optim.AdamW, "SGD": torch.optim.SGD,
                                    "USING_PYTORCH_OPTIMIZER": True},
        "megatron.core.optimizer.distrib_optimizer": {
            "Adam": torch.optim.Adam, "HAVE_APEX_OR_TE": False, "USING_TE_OPTIMIZER": False,
            "USING_APEX_OPTIMIZER": False},
        "megatron.core.optimizer.clip_grads": {
            **kernels, "l2_norm_impl": local_multi_tensor_l2_norm,
            "multi_tensor_scale_tensor_impl": None},
        "megatron.core.optimizer.optimizer": kernels,
        "megatron.core.transformer.moe.moe_utils": {"te_general_gemm": None},
    }


def install_no_te_kernels() -> None:
    """Bind Megatron's TE-bound kernels to its own fallbacks (a no-op where TE is absent)."""
    for module_name, names in _fallbacks().items():
        module = importlib.import_module(module_name)
        for name, value in names.items():
            setattr(module, name, value)

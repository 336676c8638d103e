"""The stack spec of Megatron Core's HybridModel: Megatron's own on GPU ranks, local layers on CPU.

Megatron ships one training spec, `hybrid_stack_spec` (`models/hybrid/hybrid_layer_specs.py:90`),
built from Transformer Engine's layers, and `HybridStack` builds its final norm as `TENorm`
whatever the spec says (`models/hybrid/hybrid_block.py:213-219`). CPU ranks (and
`model.transformer_impl=local`) get `local_hybrid_stack_spec`: each layer kind from the pieces
of Megatron's local GPT spec (`models/gpt/gpt_layer_specs.py:359-464`: local norms, column/row
parallel linears, `DotProductAttention`, the local MoE), the Mamba mixer with plain
column/row-parallel projections and its norm in front, and `LocalHybridStack`, which builds the
final norm from the spec instead (so the CPU runtime's spec adaptations, e.g. its
sequence-parallel norm, reach it too), and the multi-token-prediction block the pattern's
depths after '/' are built from: Megatron's hybrid MTP spec (`hybrid_layer_specs.py:71-85`)
with local norms and a column-parallel projection, its inner layers built from this same stack
spec (`transformer/multi_token_prediction.py:1016-1031`). The mixer's scan and gated norm are
Mamba kernels: on CPU the CPU runtime installs torch ones; on GPU they are mamba-ssm's and
causal-conv1d's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_submodules,
    get_mlp_module_spec_for_backend,
)
from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from megatron.core.ssm.mlp_layer import MLPLayer
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.multi_token_prediction import (
    MultiTokenPredictionBlock,
    MultiTokenPredictionBlockSubmodules,
    MultiTokenPredictionLayer,
    MultiTokenPredictionLayerSubmodules,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import (
    MoETransformerLayer,
    TransformerLayer,
    TransformerLayerSubmodules,
)

from plugins.protocol.errors import UserError
from recipes.config.machine import missing_mamba_kernels
from recipes.config.schema import RunConfig


@dataclass
class LocalHybridStackSubmodules(HybridStackSubmodules):
    """Megatron's hybrid stack submodules plus the final norm, which it hard-codes."""

    final_norm: type = IdentityOp


class LocalHybridStack(HybridStack):
    """`HybridStack` with its final norm from the spec (Megatron's is always `TENorm`,
    `hybrid_block.py:213-219`): built without it, then given the spec's own."""

    def __init__(self, config, submodules: LocalHybridStackSubmodules, *args,
                 post_layer_norm: bool = True, **kwargs) -> None:
        super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
        self.post_layer_norm = post_layer_norm
        if self.post_process and post_layer_norm:
            self.final_norm = submodules.final_norm(
                config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)


def _mixer_params(cfg: RunConfig) -> dict:
    """The mixer's own arguments that `TransformerConfig` does not carry."""
    return {"d_conv": cfg.model.mamba_conv_kernel, "chunk_size": cfg.model.mamba_chunk_size}


def local_mtp_block_spec(norm: type) -> ModuleSpec:
    """Megatron's hybrid MTP block with local modules: the embedding and hidden-state norms,
    their projection and the final norm; the inner layers come from the stack spec."""
    layer = ModuleSpec(
        module=MultiTokenPredictionLayer,
        submodules=MultiTokenPredictionLayerSubmodules(
            enorm=norm, hnorm=norm, eh_proj=ColumnParallelLinear, mtp_model_layer=None,
            layer_norm=norm),
    )
    return ModuleSpec(module=MultiTokenPredictionBlock,
                      submodules=MultiTokenPredictionBlockSubmodules(layer_specs=[layer]))


def local_hybrid_stack_spec(cfg: RunConfig) -> ModuleSpec:
    """Every layer kind of the pattern from Megatron's local modules (no Transformer Engine)."""
    m = cfg.model
    dense = get_gpt_layer_local_submodules(normalization=m.normalization)
    norm = dense.input_layernorm
    moe_mlp = get_mlp_module_spec_for_backend(
        backend=LocalSpecProvider(), num_experts=m.num_moe_experts or 1, moe_grouped_gemm=False)
    return ModuleSpec(
        module=LocalHybridStack,
        submodules=LocalHybridStackSubmodules(
            mamba_layer=ModuleSpec(
                module=MambaLayer,
                submodules=MambaLayerSubmodules(
                    norm=norm,
                    mixer=ModuleSpec(
                        module=MambaMixer, params=_mixer_params(cfg),
                        submodules=MambaMixerSubmodules(
                            in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
                    ),
                    mamba_bda=get_bias_dropout_add,
                ),
            ),
            attention_layer=ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=norm, self_attention=dense.self_attention,
                    self_attn_bda=get_bias_dropout_add),
            ),
            mlp_layer=ModuleSpec(
                module=MLPLayer,
                submodules=TransformerLayerSubmodules(
                    pre_mlp_layernorm=norm, mlp=dense.mlp, mlp_bda=get_bias_dropout_add),
            ),
            moe_layer=ModuleSpec(
                module=MoETransformerLayer,
                submodules=TransformerLayerSubmodules(
                    pre_mlp_layernorm=norm, mlp=moe_mlp, mlp_bda=get_bias_dropout_add),
            ),
            mtp_block_spec=local_mtp_block_spec(norm),
            final_norm=norm,
        ),
    )


def check_gpu_mamba_kernels() -> None:
    """A GPU rank's Mamba layers need mamba-ssm and causal-conv1d: refused in one line here too
    (the launcher refuses it before any rank starts, `recipes/config/machine.py`)."""
    missing = missing_mamba_kernels()
    if missing:
        raise UserError(f"a hybrid model's Mamba layers on GPUs need {' and '.join(missing)}, "
                        "not installed here; install the gpu extra (pip install -e '.[gpu]', "
                        "docs/hybrid-models.md) or run on CPU ranks")


def te_hybrid_stack_spec(cfg: RunConfig) -> ModuleSpec:
    """Megatron's own spec: Transformer Engine's layers, mamba-ssm's kernels."""
    check_gpu_mamba_kernels()
    from megatron.core.models.hybrid.hybrid_layer_specs import hybrid_stack_spec

    spec = copy.deepcopy(hybrid_stack_spec)
    mamba = spec.submodules.mamba_layer.submodules.mixer
    mamba.params = {**mamba.params, **_mixer_params(cfg)}
    return spec


def hybrid_stack_spec(cfg: RunConfig, transformer_engine: bool) -> ModuleSpec:
    """The stack spec for this rank's layers (`model.transformer_impl`)."""
    return te_hybrid_stack_spec(cfg) if transformer_engine else local_hybrid_stack_spec(cfg)

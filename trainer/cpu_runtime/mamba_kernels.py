"""Puts the torch Mamba2 kernels where Megatron Core's Mamba mixer looks for mamba-ssm's and
causal-conv1d's, on CPU ranks only (the `mamba_kernels` runtime patch).

`megatron/core/ssm/mamba_mixer.py` binds its kernels as module globals when it is imported
(`:61-93`): without the libraries they are None, `HAVE_MAMBA_SSM` is False, the gated norm class
is a `MagicMock` (`:89-93`) and so is `ExtendedRMSNorm`, which subclasses it (`:112`); the
mixer's constructor then raises `ImportError: MambaSSM is not installed` (`:202-205`). The mixer
reads those globals at call time, so rebinding them is enough and no spec changes:

| global (mamba_mixer.py) | called at | replaced by |
|---|---|---|
| `mamba_split_conv1d_scan_combined` | `:755-775` (training, mem-eff path) | `split_conv_scan.py` |
| `mamba_chunk_scan_combined` | `:1063-1080` (non-fused, prefill) | `ssd_scan.py` |
| `causal_conv1d_fn` | `:913-923` (non-fused path) | `causal_conv.py` |
| `RMSNormGated`, `ExtendedRMSNorm` | `:417-427`, used `:779`, `:1093` | `gated_norm.py` |
| `HAVE_MAMBA_SSM`, `MAMBA_HAS_STATE_DTYPE` | `:202`, `:95-99` | True (`state_dtype` taken) |
| `_check_mamba_sequence_packing_support` | `:746-750`, `:1490-1506` | packed training allowed |

The packing check asks for installed versions of both libraries; the torch kernels handle
`seq_idx` themselves, so packed training passes. Dynamic-batching inference
(`_dynamic_inference`, `:517`) also needs Megatron's own Triton varlen kernels and stays refused
with a reason. Activation runs only when there is no CUDA device, so GPU nodes always keep
mamba-ssm's kernels.
"""

from __future__ import annotations

from typing import Any

from trainer.models.hybrid.cpu_kernels.causal_conv import causal_conv1d_fn
from trainer.models.hybrid.cpu_kernels.gated_norm import GatedRMSNorm
from trainer.models.hybrid.cpu_kernels.split_conv_scan import mamba_split_conv1d_scan_combined
from trainer.models.hybrid.cpu_kernels.ssd_scan import mamba_chunk_scan_combined


class ShardedGatedRMSNorm(GatedRMSNorm):
    """What `ExtendedRMSNorm` adds to the gated norm (`mamba_mixer.py:112-128`, lost when its
    base is a MagicMock): the weight is sharded along dim 0 over TP in checkpoints."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> Any:
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        if not hasattr(self, "tp_group"):
            self.tp_group = parallel_state.get_tensor_model_parallel_group()
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            {"weight": 0},
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=metadata["dp_cp_group"],
        )


def packing_support_on_cpu(for_inference_not_training: bool = True) -> tuple[bool, str | None]:
    """Stands in for `_check_mamba_sequence_packing_support` (`mamba_mixer.py:1490`)."""
    if for_inference_not_training:
        return False, (
            "packed dynamic-batching inference of Mamba layers needs mamba-ssm, causal-conv1d "
            "and a GPU; the CPU kernels cover training and static prefill"
        )
    return True, None


def install_mamba_kernels() -> None:
    """Rebinds the Mamba mixer's kernel globals to the torch kernels (see the table above)."""
    from megatron.core.ssm import mamba_mixer

    mamba_mixer.mamba_split_conv1d_scan_combined = mamba_split_conv1d_scan_combined
    mamba_mixer.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    mamba_mixer.causal_conv1d_fn = causal_conv1d_fn
    mamba_mixer.RMSNormGated = GatedRMSNorm
    mamba_mixer.ExtendedRMSNorm = ShardedGatedRMSNorm
    mamba_mixer.HAVE_MAMBA_SSM = True
    mamba_mixer.MAMBA_HAS_STATE_DTYPE = True
    mamba_mixer._check_mamba_sequence_packing_support = packing_support_on_cpu

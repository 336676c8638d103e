"""What a GPU run does beside the translated config for its fast paths to work, as Megatron-LM's
own training loop does it (`megatron/training/training.py`, `initialize.py`):

- TP communication overlap: Transformer Engine's userbuffers are created once, before the model,
  for this run's [sequence x micro-batch / CP, hidden] activations (`initialize.py:190-262`);
- Transformer Engine's CUDA graphs: after `cuda_graph_warmup_steps` eager steps every layer's
  graphed modules are captured (`TECudaGraphHelper`, `transformer/cuda_graphs.py:2086`;
  Megatron-LM: `training.py:3714-3795`) and freed at the end (`:4099-4100`); graphed layers
  draw dropout from TE's RNG tracker, seeded with the rest (`tensor_parallel/random.py`);
- TE's weight-gradient fusion without APEX: the one patch here (`wgrad_fusion_without_apex`,
  in the table of patches, `trainer/megatron_patches.py`). TE's linears accumulate their weight
  gradients into the fp32 main grads inside the GEMM (`fuse_wgrad_accumulation`); Megatron's own
  output layer would need APEX for the same and refuses to be built without it
  (`tensor_parallel/layers.py:1070-1079`). It is built with APEX's check passed and then keeps
  the unfused accumulation (`layers.py:1172` reads its own flag), the path Megatron takes
  without the fusion.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from trainer.patch import Patch

WGRAD_PATCH = "wgrad_fusion_without_apex"
GPU_PATCHES: tuple[Patch, ...] = (
    Patch(WGRAD_PATCH, "ColumnParallelLinear.__init__, megatron/core/tensor_parallel/layers.py:"
          "1070-1079", "TE fuses weight-gradient accumulation without APEX; Megatron's own "
          "output layer would refuse the run, so it keeps the unfused accumulation",
          "tests/unit/test_gpu_fast_paths.py"),
)
PATCH_NAMES = tuple(patch.name for patch in GPU_PATCHES)


def _megatron_linears(module: Any) -> Iterator[Any]:
    """Megatron's own column/row-parallel linears in `module` (TE's are other classes)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    for child in module.modules():
        if type(child) in (ColumnParallelLinear, RowParallelLinear):
            yield child


@contextlib.contextmanager
def wgrad_fusion_without_apex(config: Any, chunks: list, skip: bool = False) -> Iterator[None]:
    """Around the model build: with `config.gradient_accumulation_fusion` and no APEX, Megatron's
    own linears are built past their APEX check, then each keeps the unfused accumulation; the
    chunks built inside are appended to `chunks` by the caller. `skip` leaves the patch out
    (its self-test)."""
    from megatron.core.tensor_parallel import layers

    needed = config.gradient_accumulation_fusion and not layers._grad_accum_fusion_available
    if skip or not needed:
        yield
        return
    layers._grad_accum_fusion_available = True
    try:
        yield
    finally:
        layers._grad_accum_fusion_available = False
        for chunk in chunks:
            for linear in _megatron_linears(chunk):
                linear.gradient_accumulation_fusion = False


def initialize_userbuffers(cfg: Any, config: Any) -> None:
    """Transformer Engine's userbuffers for TP communication overlap, as Megatron-LM creates them
    (`megatron/training/initialize.py:215-238`): one per TP group for activations of
    [sequence x micro-batch / CP, hidden], in FP8 when the run trains in FP8 (and in BF16 too
    when it keeps end layers out of FP8); TE's own buffer settings, bootstrapped over NCCL."""
    if not config.tp_comm_overlap:
        return
    from megatron.core.utils import is_te_min_version
    from transformer_engine.pytorch import module as te_module

    m, layout = cfg.model, cfg.layout
    shape = [m.seq_length * cfg.train.micro_batch_size // layout.context, m.hidden_size]
    if not is_te_min_version("2.7.0"):  # TE 1.9-2.6 take one FP8 switch (initialize.py:240)
        te_module.base.initialize_ub(shape=shape, tp_size=layout.tensor,
                                     use_fp8=config.fp8 is not None, ub_cfgs={},
                                     bootstrap_backend="nccl")
        return
    modes = te_module.base.UserBufferQuantizationMode
    quantization = [modes.FP8 if config.fp8 else modes.NONE]
    if config.fp8 and config.first_last_layers_bf16:
        quantization.append(modes.NONE)
    te_module.base.initialize_ub(shape=shape, tp_size=layout.tensor,
                                 quantization_modes=quantization, ub_cfgs={},
                                 bootstrap_backend="nccl")


class CudaGraphs:
    """Transformer Engine's per-layer CUDA graphs of one run: captured once, after the warm-up
    steps, before the step that follows them; freed at the end. Nothing for other runs."""

    def __init__(self, session: Any, config: Any) -> None:
        self.helper = None
        self.model = session.model
        self.warmup = session.cfg.train.cuda_graph_warmup_steps
        self.start = session.start_step
        self.modules = list(session.cfg.train.cuda_graph_modules)
        o = session.cfg.optimizer
        # The distributed optimizer's overlapped all-gather runs in forward pre-hooks, which
        # capture must not record (Megatron-LM's should_disable_forward_pre_hook).
        self.gather_hooks = o.distributed and o.overlap_param_gather
        if config is None or config.cuda_graph_impl != "transformer_engine":
            return
        from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

        cfg = session.cfg
        self.helper = TECudaGraphHelper(
            model=session.model, config=config, seq_length=cfg.model.seq_length,
            micro_batch_size=cfg.train.micro_batch_size, optimizers=[session.optimizer])

    def before_step(self, step: int) -> None:
        """Capture before the first step after the warm-up, as Megatron-LM does
        (`training.py:3784-3795`), with the DP all-gather's forward hooks off while capturing."""
        if self.helper is None or self.helper.capture_finished():
            return
        if step - self.start != self.warmup:
            return
        hooks = self.warmup > 0 and self.gather_hooks
        if hooks:
            for chunk in self.model:
                chunk.disable_forward_pre_hook(param_sync=False)
        self.helper.create_cudagraphs()
        import torch

        if torch.distributed.get_rank() == 0:
            print(f"CUDA graphs: captured Transformer Engine's graphs after {self.warmup} "
                  f"warm-up step(s) ({', '.join(self.modules) or 'whole layers'})", flush=True)
        if hooks:
            for chunk in self.model:
                chunk.enable_forward_pre_hook()
            self.helper.cuda_graph_set_manual_hooks()

    def close(self) -> None:
        if self.helper is not None and self.helper.graphs_created():
            self.helper.delete_cuda_graphs()

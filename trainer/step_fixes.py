"""Megatron defects in the training step itself, fixed from outside at run time on every device.

The CPU runtime's patches make Megatron Core run without CUDA and the checkpoint fixes mend its
save and load; what is here fails the same way on GPUs and CPUs, so it cannot be a CPU patch
(a CPU run would then pass where a GPU run stops). Each is an entry of the one table of patches
(`trainer/megatron_patches.py`). `apply_step_fixes()` installs them once per process, before the
optimizer is built (`trainer/session.py`); `skip=` leaves one out for its self-test, and, as for
the CPU runtime, the first call decides and later ones change nothing.
"""

from __future__ import annotations

from trainer.patch import Patch, PatchSet

FSDP_UNSCALING = "fsdp_empty_shard_unscaling"
RECOMPUTE_WITHOUT_TE = "recompute_without_te_fp8_state"
STEP_PATCHES: tuple[Patch, ...] = (
    Patch(FSDP_UNSCALING, "DistributedOptimizer._collect_main_grad_data_for_unscaling, "
          "optimizer/distrib_optimizer.py:2603, under Megatron FSDP (no grad for an empty shard, "
          "distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:3393-3394)",
          "fp16 at DP>1 under Megatron FSDP stops at the first step: AttributeError: "
          "'NoneType' object has no attribute 'data'",
          "tests/dist/test_fp16_resume_before_first_update.py"),
    Patch(RECOMPUTE_WITHOUT_TE, "CheckpointWithoutOutput.__init__, tensor_parallel/random.py:740 "
          "(`fp8 is not None`, so True for fp8=False), read at random.py:692-696 where "
          "FP8GlobalStateManager is bound only with Transformer Engine (random.py:84-91)",
          "layernorm or moe_act recompute without Transformer Engine stops in the first forward: "
          "NameError: name 'FP8GlobalStateManager' is not defined",
          "tests/unit/test_step_fixes.py"),
)
PATCH_NAMES = tuple(patch.name for patch in STEP_PATCHES)


def install_fsdp_unscaling() -> None:
    """fp16 under Megatron FSDP: the loss scaler's unscaling reads every parameter's gradient
    (`DistributedOptimizer._collect_main_grad_data_for_unscaling`, optimizer/distrib_optimizer.py:
    2590-2606), and Megatron FSDP gives none to a parameter whose shard on this rank is empty
    (param_and_grad_buffer.py:3393-3394). Those have nothing to unscale or check: left out.
    Without Megatron FSDP, Megatron's own method runs."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    collect = DistributedOptimizer._collect_main_grad_data_for_unscaling

    def without_empty_shards(self):
        if not self.ddp_config.use_megatron_fsdp:
            return collect(self)
        decoupled = self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
        grads = [getattr(param, "decoupled_grad" if decoupled else "grad")
                 for group in self.optimizer.param_groups for param in group["params"]]
        return [grad.data for grad in grads if grad is not None]

    DistributedOptimizer._collect_main_grad_data_for_unscaling = without_empty_shards


def install_recompute_without_te() -> None:
    """Selective recompute of `layernorm` (transformer_layer.py:633, 766) and `moe_act`
    (moe/experts.py:883) checkpoints through `CheckpointWithoutOutput()`, whose `fp8` is
    `fp8 is not None`, True for its default False (random.py:740); its forward then asks
    Transformer Engine's FP8GlobalStateManager (random.py:692-696), a name bound only when TE
    imports (random.py:84-91). Without TE no FP8 can be on: `fp8` is set False there, which is
    the branch Megatron's forward takes for a checkpoint without FP8. With TE, nothing changes."""
    from megatron.core.tensor_parallel import random

    if random.HAVE_TE:
        return
    init = random.CheckpointWithoutOutput.__init__

    def without_fp8_state(self, fp8=False):
        init(self, fp8)
        self.fp8 = False

    random.CheckpointWithoutOutput.__init__ = without_fp8_state


_FIXES = PatchSet("step fixes", {FSDP_UNSCALING: install_fsdp_unscaling,
                                 RECOMPUTE_WITHOUT_TE: install_recompute_without_te}, PATCH_NAMES)


def apply_step_fixes(skip: frozenset[str] = frozenset()) -> None:
    """Install every step fix but those `skip` names; a second call is a no-op."""
    _FIXES.install_once(skip)

"""Megatron-LM's own loop (`megatron.training.pretrain`) on CPU, for the parity check and the
checkpoint moves between Megatron-LM and this trainer.

The parity check (`trainer/tools/megatron_parity.py`) trains the same steps through Megatron-LM's
loop beside ours; on a CPU rank the CPU runtime makes Megatron Core run, and three places of
`megatron.training` still insist on a GPU or a build tree. A fourth is Megatron Core's own:
without Transformer Engine's or Apex's fused Adam (on CPU) the distributed optimizer's load path
fails or drifts, which this trainer's load works around (`trainer/checkpoint/megatron_fixes.py`);
Megatron-LM's `load_checkpoint` gets the same fixes. A fifth is a defect of Megatron-LM's
`training_log` on any device: for a hybrid model over pipeline stages of which one has no MoE
layer, the MoE metrics it all-reduces over PP are of other sizes on that stage than on the
others, so the run aborts (gloo) or hangs (NCCL) at its first log; they are created first at
the size the router records them. A sixth is Megatron Core's where Transformer Engine is
installed: a block built from a layer spec, as Megatron-LM builds `--transformer-impl local`,
takes TE's norm as its final norm, which needs CUDA. Each is a named patch of the one table
(`trainer/megatron_patches.py`), applied while `megatron_lm_on_cpu()` is active; `skip=` leaves
any out, which is how `tests/unit/test_megatron_lm_on_cpu.py` shows the first three, the
fifth and the sixth are needed (the fourth: tests/dist/test_megatron_lm_checkpoints.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from trainer.patch import Patch, refuse_unknown

_SELF_TEST = "tests/unit/test_megatron_lm_on_cpu.py"
_LOAD_SELF_TEST = "tests/dist/test_megatron_lm_checkpoints.py"
MEGATRON_LM_PATCHES: tuple[Patch, ...] = (
    Patch("megatron_lm_device_arch", "megatron.training.arguments.get_device_arch_version, "
          "asked under TP or CP (training/arguments.py:1413-1414)",
          "it reads the GPU's properties and raises without one; CPU work runs in one in-order "
          "queue, so the CUDA_DEVICE_MAX_CONNECTIONS ordering it guards is moot: answered as "
          "Blackwell (10)", _SELF_TEST),
    Patch("megatron_lm_init_without_cuda", "initialize_megatron, which asserts CUDA and without "
          "a device skips the model-parallel groups and RNG seeds (training/initialize.py:64-66, "
          ":358)", "called with allow_no_cuda=True while one device is reported, it sets up "
          "the groups and seeds as on one GPU", _SELF_TEST),
    Patch("megatron_lm_compiled_helpers", "megatron.core.datasets.utils.compile_helpers, run "
          "by rank 0 (training/initialize.py:176-178)", "the wheel ships the dataset helpers "
          "compiled (helpers_cpp) but not their Makefile, so `make` fails and the rank exits; "
          "importing the compiled module is what compiling would give", _SELF_TEST),
    Patch("megatron_lm_distributed_optimizer_load", "megatron.training.training.load_checkpoint "
          "(training/training.py:2199) on the distributed optimizer's torch-Adam branch "
          "(optimizer/distrib_optimizer.py:20-35): `assert len(steps) == 1` (:839) for a fresh "
          "optimizer, the per-parameter copy's missing `step` (:1193-1225), one shared step "
          "(:1028-1032)", "Megatron-LM cannot resume a distributed-optimizer checkpoint on CPU "
          "otherwise; the load gets this trainer's own load-path fixes (create_state_if_missing, "
          "load_without_grad, keep_step_out_of_param_state, give_each_param_its_own_step)",
          _LOAD_SELF_TEST),
    Patch("megatron_lm_hybrid_moe_metrics_size", "megatron.training.training.training_log "
          "(training/training.py:2771-2790): for a hybrid model it force-initializes a stage's "
          "missing MoE metrics with the pattern's MoE-layer count (moe_logging.py:184), where "
          "the router records them sized num_layers + MTP layers (moe/router.py:587-599)",
          "a pipeline stage without MoE layers then all-reduces tensors of another size over "
          "PP than the stages with them (moe_logging.py:277): gloo aborts, NCCL hangs; the "
          "metrics are created first at the router's size, and the average stays Megatron's",
          _SELF_TEST),
    Patch("megatron_lm_local_final_norm", "megatron.core.transformer.transformer_block."
          "LayerNormImpl, the final norm of a block built from a layer spec (transformer_block"
          ".py:251-253; TENorm whenever TE imports, :53-56), as Megatron-LM's GPT builder makes "
          "one for --transformer-impl local", "with TE installed a CPU rank's first forward "
          "fails in TE's norm: RuntimeError: CUDAGuardImpl initialized with non-CUDA DeviceType: "
          "cpu; it is Megatron's norm without TE (WrappedTorchNorm) on CPU, as in this trainer's "
          "block spec", _SELF_TEST),
)
PATCH_NAMES = tuple(patch.name for patch in MEGATRON_LM_PATCHES)


def _device_arch_of_a_cpu() -> int:
    return 10


def _helpers_are_compiled() -> None:
    import megatron.core.datasets.helpers_cpp  # noqa: F401


def _load_with_fixes(load):
    """Megatron-LM's `load_checkpoint` with the distributed optimizer's load-path fixes, as this
    trainer's load applies them (`trainer/checkpoint/load.py`): state to describe before the
    template, no grad and the parameter's own step while the state is copied in, then one step
    tensor per parameter."""
    from megatron.training import get_args
    from megatron.training.checkpointing import checkpoint_exists

    from trainer.checkpoint import megatron_fixes

    def load_checkpoint(model, optimizer, *args, **kwargs):
        if optimizer is None or not checkpoint_exists(get_args().load):
            return load(model, optimizer, *args, **kwargs)
        megatron_fixes.create_state_if_missing(optimizer)
        own = optimizer.load_state_dict

        def load_state_dict(state):
            with megatron_fixes.load_without_grad(), \
                    megatron_fixes.keep_step_out_of_param_state(optimizer):
                own(state)
            megatron_fixes.give_each_param_its_own_step(optimizer)

        optimizer.load_state_dict = load_state_dict
        try:
            return load(model, optimizer, *args, **kwargs)
        finally:
            del optimizer.load_state_dict
    return load_checkpoint


# What the router records (moe/router.py:441, :496, :543, :596-603, :697-703): the aux losses of
# the three load-balancing types and the z-loss.
_ROUTER_METRICS = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss",
                   "z_loss")


def _metrics_sized_as_the_router_records(log):
    """Megatron-LM's `training_log` with a hybrid model's MoE metrics created, where missing,
    at the size the router gives them, so the sizes its `force_initialize` picks never
    apply."""
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    from megatron.training import get_args
    from megatron.training.utils import is_hybrid_model

    def training_log(*args, **kwargs):
        megatron_args = get_args()
        if megatron_args.num_experts is not None and is_hybrid_model(megatron_args):
            size = megatron_args.num_layers + (megatron_args.mtp_num_layers or 0)
            tracker = get_moe_metrics_tracker()
            for name in _ROUTER_METRICS:
                tracker.ensure_initialized(name, size)
        return log(*args, **kwargs)
    return training_log


@contextlib.contextmanager
def megatron_lm_on_cpu(skip: frozenset[str] = frozenset()) -> Iterator[None]:
    """Megatron-LM's training entry runnable on this CPU rank while active (each patch that
    `skip` does not name; GPU ranks keep the device's own architecture)."""
    import megatron.core.datasets.utils as dataset_utils
    import megatron.core.transformer.transformer_block as transformer_block
    import megatron.training.arguments as arguments
    import megatron.training.training as training
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    skip = refuse_unknown("Megatron-LM patches", skip, PATCH_NAMES)
    from megatron.core.optimizer import distrib_optimizer

    saved = (arguments.get_device_arch_version, training.initialize_megatron,
             dataset_utils.compile_helpers, training.load_checkpoint, training.training_log,
             transformer_block.LayerNormImpl)
    count = torch.cuda.device_count
    initialize = training.initialize_megatron

    def initialize_megatron(*args, **kwargs):
        torch.cuda.device_count = lambda: 1
        try:
            return initialize(*args, allow_no_cuda=True, **kwargs)
        finally:
            torch.cuda.device_count = count

    if "megatron_lm_device_arch" not in skip and not torch.cuda.is_available():
        arguments.get_device_arch_version = _device_arch_of_a_cpu
    if "megatron_lm_init_without_cuda" not in skip:
        training.initialize_megatron = initialize_megatron
    if "megatron_lm_compiled_helpers" not in skip:
        dataset_utils.compile_helpers = _helpers_are_compiled
    if ("megatron_lm_distributed_optimizer_load" not in skip
            and not distrib_optimizer.HAVE_APEX_OR_TE):
        training.load_checkpoint = _load_with_fixes(training.load_checkpoint)
    if "megatron_lm_hybrid_moe_metrics_size" not in skip:
        training.training_log = _metrics_sized_as_the_router_records(training.training_log)
    if "megatron_lm_local_final_norm" not in skip and not torch.cuda.is_available():
        transformer_block.LayerNormImpl = WrappedTorchNorm
    try:
        yield
    finally:
        (arguments.get_device_arch_version, training.initialize_megatron,
         dataset_utils.compile_helpers, training.load_checkpoint, training.training_log,
         transformer_block.LayerNormImpl) = saved

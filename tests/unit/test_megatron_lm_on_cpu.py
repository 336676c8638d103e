"""Each patch that runs Megatron-LM's loop on CPU (`trainer/cpu_runtime/megatron_lm.py`) is
needed: with it the call Megatron-LM makes goes through, left out (`skip=`) the same call fails
as it does on a CPU rank without it (the hybrid MoE metrics: its all-reduce over PP gets another
size on a stage without MoE layers). The whole loop runs in tests/dist/test_megatron_parity.py
and, a hybrid over TP2 x PP2, in tests/dist/test_megatron_lm_checkpoints.py.
"""

from __future__ import annotations

import pytest
import torch

from trainer.cpu_runtime.megatron_lm import PATCH_NAMES, megatron_lm_on_cpu

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the patches are for CPU ranks; a GPU has an arch")


class Reached(Exception):
    """Raised where the patched call got past the point the patch is for."""


def device_arch() -> int:
    import megatron.training.arguments as arguments

    return arguments.get_device_arch_version()


def init_without_cuda(monkeypatch) -> int:
    """initialize_megatron as pretrain calls it: past its CUDA assert it reads the global args;
    how many devices it sees there is returned through `Reached`."""
    import megatron.training.initialize as initialize
    import megatron.training.training as training

    def get_args():
        raise Reached(torch.cuda.device_count())

    monkeypatch.setattr(initialize, "get_args", get_args)
    training.initialize_megatron()
    return -1


def compiled_helpers() -> None:
    import megatron.core.datasets.utils as dataset_utils

    dataset_utils.compile_helpers()


def moe_metric_sizes(monkeypatch) -> dict[str, int]:
    """Megatron-LM's `training_log` after a step of the tiny hybrid over 2 pipeline stages, on
    the first stage (M*-, no MoE layer, so its router recorded nothing): the size of each MoE
    metric it all-reduces over PP, returned through `Reached` where that all-reduce would run
    (moe_logging.py:277); and the size the second stage's router records them at."""
    import sys

    import megatron.training.training as training
    from megatron.core.transformer.moe import moe_logging
    from megatron.training.arguments import parse_and_validate_args

    from recipes.config.megatron_args import script_name
    from recipes.resolve import resolve_config
    from trainer.tools.megatron_parity import _forget_megatron_lm, parity_arguments

    cfg = resolve_config(["recipe=hybrid_tiny_pp2"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "argv", [script_name(cfg), *parity_arguments(cfg, 2)])

    def sync(tracker, names, pg_collection=None):
        raise Reached({name: tracker.metrics[name].values.numel() for name in names})

    monkeypatch.setattr(training, "reduce_max_stat_across_model_parallel_group",
                        lambda stat, group=None: stat)  # the lr over the model-parallel group
    monkeypatch.setattr(moe_logging.MoEMetricsTracker, "_sync_metrics", sync)
    moe_logging.destroy_moe_metrics_tracker()
    try:
        args = parse_and_validate_args()
        router = args.num_layers + (args.mtp_num_layers or 0)  # moe/router.py:587-590
        training.training_log({}, {}, 1e-3, 1, 1.0, False, False, 1.0, None, None, None)
    except Reached as reached:
        return {**reached.args[0], "router": router}
    finally:
        _forget_megatron_lm()
        moe_logging.destroy_moe_metrics_tracker()
    return {}


def check_device_arch(monkeypatch):
    with megatron_lm_on_cpu():
        assert device_arch() == 10
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_device_arch"})):
        with pytest.raises(RuntimeError):  # no GPU's properties to read
            device_arch()


def check_init_without_cuda(monkeypatch):
    with megatron_lm_on_cpu(), pytest.raises(Reached) as reached:
        init_without_cuda(monkeypatch)
    assert reached.value.args == (1,)  # one device while initializing
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_init_without_cuda"})), \
            pytest.raises(AssertionError, match="Megatron requires CUDA"):
        init_without_cuda(monkeypatch)
    assert torch.cuda.device_count() == 0  # restored


def check_compiled_helpers(monkeypatch):
    with megatron_lm_on_cpu():
        compiled_helpers()
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_compiled_helpers"})), \
            pytest.raises((SystemExit, FileNotFoundError)):  # make fails, or there is no make
        compiled_helpers()


def check_hybrid_moe_metrics_size(monkeypatch):
    """6 layers, one of them MoE: the stage without it must all-reduce 6 slots, as the stage
    with it does; Megatron-LM's own `force_initialize` gives it 1."""
    with megatron_lm_on_cpu():
        sizes = moe_metric_sizes(monkeypatch)
    assert sizes == {"load_balancing_loss": 6, "seq_load_balancing_loss": 6, "router": 6}
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_hybrid_moe_metrics_size"})):
        sizes = moe_metric_sizes(monkeypatch)
    assert sizes == {"load_balancing_loss": 1, "seq_load_balancing_loss": 1, "router": 6}


def check_local_final_norm(monkeypatch):
    """Where TE is installed Megatron binds TENorm as the final norm of a block built from a
    layer spec (transformer_block.py:53-56); planted here as that binding (no TE on this
    machine), it is Megatron's norm without TE while the patches are active, and restored."""
    import megatron.core.transformer.transformer_block as transformer_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    class TENorm:  # stands for transformer_engine's: building it on CPU raises
        def __new__(cls, *args, **kwargs):
            raise RuntimeError("CUDAGuardImpl initialized with non-CUDA DeviceType: cpu")

    monkeypatch.setattr(transformer_block, "LayerNormImpl", TENorm)
    with megatron_lm_on_cpu():
        assert transformer_block.LayerNormImpl is WrappedTorchNorm
    assert transformer_block.LayerNormImpl is TENorm
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_local_final_norm"})), \
            pytest.raises(RuntimeError, match="CUDAGuardImpl"):
        transformer_block.LayerNormImpl()


# Each patch's check, by the name `skip=` leaves it out by. The distributed optimizer's load
# needs a checkpoint and process groups: its check is tests/dist/test_megatron_lm_checkpoints.py's.
CHECKS = {
    "megatron_lm_device_arch": check_device_arch,
    "megatron_lm_init_without_cuda": check_init_without_cuda,
    "megatron_lm_compiled_helpers": check_compiled_helpers,
    "megatron_lm_hybrid_moe_metrics_size": check_hybrid_moe_metrics_size,
    "megatron_lm_local_final_norm": check_local_final_norm,
}
CHECKED_ELSEWHERE = {"megatron_lm_distributed_optimizer_load"}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_patch_is_needed(name, monkeypatch):
    CHECKS[name](monkeypatch)


def test_every_patch_has_its_check():
    assert set(PATCH_NAMES) == set(CHECKS) | CHECKED_ELSEWHERE
    with pytest.raises(ValueError, match="unknown Megatron-LM patches"), \
            megatron_lm_on_cpu(skip=frozenset({"nope"})):
        pass

"""Each patch that runs Megatron-LM's loop on CPU (`trainer/cpu_runtime/megatron_lm.py`) is
needed: with it the call Megatron-LM makes goes through, left out (`skip=`) the same call fails
as it does on a CPU rank without it. The whole loop runs in tests/dist/test_megatron_parity.py.
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


def test_device_arch():
    with megatron_lm_on_cpu():
        assert device_arch() == 10
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_device_arch"})):
        with pytest.raises(RuntimeError):  # no GPU's properties to read
            device_arch()


def test_init_without_cuda(monkeypatch):
    with megatron_lm_on_cpu(), pytest.raises(Reached) as reached:
        init_without_cuda(monkeypatch)
    assert reached.value.args == (1,)  # one device while initializing
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_init_without_cuda"})), \
            pytest.raises(AssertionError, match="Megatron requires CUDA"):
        init_without_cuda(monkeypatch)
    assert torch.cuda.device_count() == 0  # restored


def test_compiled_helpers():
    with megatron_lm_on_cpu():
        compiled_helpers()
    with megatron_lm_on_cpu(skip=frozenset({"megatron_lm_compiled_helpers"})), \
            pytest.raises((SystemExit, FileNotFoundError)):  # make fails, or there is no make
        compiled_helpers()


def test_every_patch_has_its_check_here():
    """The distributed optimizer's load needs a checkpoint and process groups: its check is
    tests/dist/test_megatron_lm_checkpoints.py's."""
    assert set(PATCH_NAMES) == {"megatron_lm_device_arch", "megatron_lm_init_without_cuda",
                                "megatron_lm_compiled_helpers",
                                "megatron_lm_distributed_optimizer_load"}
    with pytest.raises(ValueError, match="unknown Megatron-LM patches"), \
            megatron_lm_on_cpu(skip=frozenset({"nope"})):
        pass

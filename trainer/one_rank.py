"""One process as Megatron's parallel state: the recipe's model on one rank (world size 1,
gloo), for what reads or times the model outside a launched run (the HF converters' template,
`calibrate=true`'s layer timing) without starting ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import torch

from recipes.config.schema import ClusterConfig, ParallelConfig, RunConfig


def single_rank(cfg: RunConfig) -> RunConfig:
    """The same model on one rank, its vocabulary padded as `cfg`'s layout pads it."""
    one = dataclasses.replace(
        cfg, parallel=ParallelConfig(), cluster=ClusterConfig(nodes=1, gpus_per_node=1),
        model=dataclasses.replace(
            cfg.model,
            make_vocab_size_divisible_by=cfg.model.make_vocab_size_divisible_by
            * cfg.parallel.tensor,
        ),
    )
    one.train = dataclasses.replace(cfg.train, global_batch_size=cfg.train.micro_batch_size)
    return one


def _start_group() -> bool:
    """A gloo group of one process (unless the caller already runs in one)."""
    if torch.distributed.is_initialized():
        return False
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    torch.distributed.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(minutes=30)
    )
    return True


@contextlib.contextmanager
def one_process(cfg: RunConfig) -> Iterator[RunConfig]:
    """Megatron's parallel state for `single_rank(cfg)` in this process; yields that config."""
    from megatron.core import parallel_state

    from plugins.protocol.events import RuntimeContext
    from plugins.registry import build_plugins
    from trainer.mcore_translation import initialize_parallel_state

    one = single_rank(cfg)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() != 1:
        raise RuntimeError("conversion runs in one process (world size 1)")
    build_plugins(one).setup_runtime(RuntimeContext())
    created = _start_group()
    initialize_parallel_state(one.layout)
    # Megatron forks the model-parallel RNG tracker while building or running a model: the
    # Mamba mixer for its conv and dt weights even on the meta device
    # (`ssm/mamba_mixer.py:318, 366`), attention dropout on every forward
    # (`transformer/dot_product_attention.py:217`).
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(one.train.seed)
    try:
        yield one
    finally:
        parallel_state.destroy_model_parallel()
        if created:
            torch.distributed.destroy_process_group()

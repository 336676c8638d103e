"""A one-rank gloo world for a unit test that builds the real Megatron model in-process (on one
CPU rank): the process group and Megatron's parallel state, torn down after the test so the next
one starts clean. A test file wraps it in its own `one_rank` fixture."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def one_rank_world(folder: Path) -> Iterator[Callable[[Any], Any]]:
    """A one-rank gloo world (its rendezvous file in `folder`); yields a function that sets up
    Megatron's process groups for a config's layout. Both are torn down on leaving."""
    import torch
    from megatron.core import parallel_state

    from trainer.mcore_translation import initialize_parallel_state

    torch.distributed.init_process_group("gloo", init_method=f"file://{folder / 'store'}",
                                         rank=0, world_size=1)
    try:
        yield lambda cfg: initialize_parallel_state(cfg.layout)
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()

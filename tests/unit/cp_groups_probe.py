"""Subprocess body for test_cp_comm_types.py: Megatron's hierarchical CP groups as the one
translation creates them for a2a+p2p, rank by rank on torch's fake backend, as JSON.

For each rank of the run the argv describes, it creates the default group on the fake backend,
calls `trainer.mcore_translation.initialize_parallel_state` with the plugins'
`process_group_options` (with them, and again without), and records the global ranks of every
hierarchical CP group this rank is in and whether the CP plugin accepts the set-up.
Output: one JSON line {"with": [...], "without": [...]}, one entry per rank.
"""

from __future__ import annotations

import json
import sys

import torch
from megatron.core import parallel_state as ps
from torch.testing._internal.distributed.fake_pg import FakeStore

from plugins.protocol.errors import UserError
from recipes.resolve import resolve_config
from trainer.mcore_translation import initialize_parallel_state


def _rank(cfg, rank: int, options: dict) -> dict:
    torch.distributed.init_process_group("fake", store=FakeStore(), rank=rank,
                                         world_size=cfg.layout.world_size)
    try:
        initialize_parallel_state(cfg.layout, create_gloo_groups=False, options=options)
        groups = ps.get_hierarchical_context_parallel_groups(check_initialized=False) or []
        from plugins.context_parallel.plugin import _require_hierarchical_groups

        try:
            _require_hierarchical_groups()
            refusal = None
        except UserError as error:
            refusal = str(error)
        return {"groups": [list(torch.distributed.get_process_group_ranks(g)) for g in groups],
                "refusal": refusal}
    finally:
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    cfg = resolve_config(sys.argv[1:])
    options = cfg.plugins.process_group_options(cfg)
    ranks = range(cfg.layout.world_size)
    print(json.dumps({"options": options,
                      "with": [_rank(cfg, r, options) for r in ranks],
                      "without": [_rank(cfg, r, {}) for r in ranks]}))

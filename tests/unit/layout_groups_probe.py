"""The groups probe for test_layout_groups.py, run by recipe_probe.py: Megatron Core's own
groups, rank by rank.

`recipes.config.layout.Layout` computes every process group itself, without torch. This probe
is the independent answer it is checked against: for each recipe named on argv and for every
rank of its world, it starts that rank on torch's `fake` process-group backend, lets
`parallel_state.initialize_model_parallel` build all groups from the recipe's raw sizes
(`cfg.parallel`, world size from `cfg.cluster`; never from `Layout`), and records the global
ranks of each group that rank belongs to, plus the rank's coordinates from Megatron's getters.
For rank 0 it also records every group Megatron creates, in creation order, by watching
`torch.distributed.new_group` (Megatron itself is not touched), so the test can compare whole
group lists, order of groups included.

It runs in a process of its own because it creates and destroys default process groups, which
is process-wide state. Nothing here needs CUDA: no Gloo groups, no model, no collectives.
`probe(name)`: {"ranks": [...], "created": {...}}.
"""

from __future__ import annotations

from unittest import mock

import torch
from megatron.core import parallel_state as ps
from torch.testing._internal.distributed.fake_pg import FakeStore

from recipes.registry import get_recipe

ALL_RANKS_UP_TO = 1024  # larger worlds: rank 0 only (see probed_ranks)

# Layout's group kind -> the Megatron getter of the caller rank's group of that kind.
GROUP_GETTERS = {
    "tp": ps.get_tensor_model_parallel_group,
    "pp": ps.get_pipeline_model_parallel_group,
    "dp": lambda: ps.get_data_parallel_group(with_context_parallel=False),
    "dp-cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
    "cp": ps.get_context_parallel_group,
    "tp-pp": ps.get_model_parallel_group,
    "ep": ps.get_expert_model_parallel_group,
    "expert-tp": ps.get_expert_tensor_parallel_group,
    "expert-dp": ps.get_expert_data_parallel_group,
}

# Coordinate name -> Megatron's rank getter.
RANK_GETTERS = {
    "tp": ps.get_tensor_model_parallel_rank,
    "pp": ps.get_pipeline_model_parallel_rank,
    "dp": ps.get_data_parallel_rank,
    "cp": ps.get_context_parallel_rank,
    "ep": ps.get_expert_model_parallel_rank,
}

# The `group_desc` Megatron 0.19.2 passes to new_group for each of Layout's group kinds.
CREATED_AS = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp-cp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "MODEL_PARALLEL_GROUP": "tp-pp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "expert-tp",
    "EXPERT_DATA_PARALLEL_GROUP": "expert-dp",
    "EMBEDDING_GROUP": "embedding",
}


def _ranks_of(group) -> list[int]:
    return list(torch.distributed.get_process_group_ranks(group))


def _record(rank: int) -> dict:
    """What Megatron says about the current rank: its groups (global ranks) and coordinates."""
    groups = {kind: _ranks_of(getter()) for kind, getter in GROUP_GETTERS.items()}
    # 0.19.2 leaves the embedding group None on ranks outside every embedding group (middle
    # pipeline stages); is_rank_in_embedding_group() says whether this rank has one.
    in_embedding = ps.is_rank_in_embedding_group(ignore_virtual=True)
    groups["embedding"] = _ranks_of(ps.get_embedding_group()) if in_embedding else None
    coordinates = {name: getter() for name, getter in RANK_GETTERS.items()}
    return {"rank": rank, "groups": groups, "coordinates": coordinates}


def megatron_inputs(cfg) -> dict:
    """All that Megatron's groups are built from here: the recipe's world size and raw parallel
    sizes (never `Layout`). Recipes with equal inputs get equal groups, so the test probes one
    of them for all."""
    p = cfg.parallel
    return {"world_size": cfg.cluster.world_size, "tensor_model_parallel_size": p.tensor,
            "pipeline_model_parallel_size": p.pipeline,
            "virtual_pipeline_model_parallel_size": p.virtual_pipeline,
            "context_parallel_size": p.context, "expert_model_parallel_size": p.expert,
            "expert_tensor_parallel_size": p.expert_tensor}


def _initialize(cfg) -> None:
    sizes = {key: value for key, value in megatron_inputs(cfg).items() if key != "world_size"}
    ps.initialize_model_parallel(
        **sizes,
        create_gloo_process_groups=False,  # Gloo cannot run on the fake store
    )


def _megatron_rank(cfg, rank: int, created: dict | None = None) -> dict:
    """Build Megatron's parallel state for one rank of `cfg` on the fake backend; record it.

    With `created`, also fill it with every group of a known kind that Megatron asks torch
    for, in the order it asks (each rank creates all groups, members or not).
    """
    torch.distributed.init_process_group(
        "fake", store=FakeStore(), rank=rank, world_size=megatron_inputs(cfg)["world_size"]
    )
    try:
        if created is None:
            _initialize(cfg)
        else:
            with mock.patch.object(
                torch.distributed, "new_group", wraps=torch.distributed.new_group
            ) as new_group:
                _initialize(cfg)
            for call in new_group.call_args_list:
                kind = CREATED_AS.get(call.kwargs.get("group_desc"))
                if kind is not None:
                    created.setdefault(kind, []).append(list(call.kwargs["ranks"]))
        return _record(rank)
    finally:
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def probed_ranks(world_size: int) -> list[int]:
    """Every rank up to ALL_RANKS_UP_TO; beyond, rank 0 only. Each rank's set-up creates every
    group of the world (about 15 s at 16,384 ranks), and rank 0's record of all created groups,
    compared whole and in order, already pins every rank's groups."""
    return list(range(world_size)) if world_size <= ALL_RANKS_UP_TO else [0]


def probe(name: str) -> dict:
    cfg = get_recipe(name)
    created: dict[str, list[list[int]]] = {}
    ranks = [
        _megatron_rank(cfg, rank, created if rank == 0 else None)
        for rank in probed_ranks(cfg.cluster.world_size)
    ]
    return {"ranks": ranks, "created": created}

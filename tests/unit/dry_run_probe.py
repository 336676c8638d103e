"""The dry-run probe of the `dry_run_probes` fixture (tests/unit/conftest.py), run by
recipe_probe.py: what test_dry_run.py and test_plan_params.py check of a recipe's dry run.

Runs in a process of its own because the dry run activates the CPU runtime (process-wide
patches) and creates fake process groups.
"""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from recipes.config.schema import ClusterConfig, ParallelConfig
from recipes.models.hybrid.pattern import PIPE
from recipes.registry import get_recipe
from trainer.tools.dry_run import (
    active_parameters,
    collect_shards,
    model_parameters,
    print_report,
)


def unsharded_reference(cfg):
    """The same model on one rank (vocab padded as the sharded run pads it)."""
    single = dataclasses.replace(
        cfg,
        parallel=ParallelConfig(),
        cluster=ClusterConfig(nodes=1, gpus_per_node=1),
        model=dataclasses.replace(
            cfg.model,
            make_vocab_size_divisible_by=cfg.model.make_vocab_size_divisible_by
            * cfg.parallel.tensor,
            # One rank holds one segment: the whole pattern without its stage cuts (its MTP
            # depths after '/' kept).
            hybrid_layer_pattern=cfg.model.hybrid_layer_pattern
            and cfg.model.hybrid_layer_pattern.replace(PIPE, ""),
        ),
    )
    single.train.global_batch_size = single.train.micro_batch_size
    return single


def probe(name: str) -> dict:
    cfg = get_recipe(name)
    shards = collect_shards(cfg)
    report = io.StringIO()
    print_report(cfg, shards, 0.0, Console(file=report, width=200))
    reference = collect_shards(unsharded_reference(cfg))
    return {
        "shards": [
            {"pp": s.coords.pp, "tp": s.coords.tp, "ep": s.coords.ep, "layers": s.layers,
             "ranks": s.ranks, "parameters": s.parameters, "held": s.held_parameters,
             "mtp_layers": s.mtp_layers}
            for s in shards
        ],
        "total": model_parameters(shards, cfg.layout.expert_tensor_size),
        "active": active_parameters(shards, cfg),
        "unsharded_total": model_parameters(reference),
        "report": report.getvalue(),
    }

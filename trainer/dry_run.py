"""Dry run: every distinct rank of a big layout, built for real on one CPU with no memory.

One process takes each rank of the world in turn on torch's `fake` process-group backend,
sets up Megatron's parallel state for it and, for the first rank of each distinct model
shard (TP x PP x EP coordinates), builds the real Megatron Core model chunks on the meta
device. Placement (node:GPU of every rank) comes from Megatron's own rank order.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from rich.console import Console
from rich.table import Table

from recipes.schema import RunConfig


@dataclass(frozen=True)
class RankCoordinates:
    rank: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int

    def shard_key(self) -> tuple[int, int, int]:
        return (self.pp, self.tp, self.ep)


@dataclass
class ShardReport:
    """What one distinct model shard holds, and every rank that holds a copy of it."""

    coords: RankCoordinates
    dense_parameters: int  # excluding copies of weights another shard already holds
    expert_parameters: int
    layers: list[list[int]]  # global layer numbers (1-based) per virtual stage
    ranks: list[int] = dataclasses.field(default_factory=list)

    @property
    def parameters(self) -> int:
        return self.dense_parameters + self.expert_parameters


def _start_fake_rank(cfg: RunConfig, rank: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainer.mcore_translation import initialize_parallel_state

    torch.distributed.init_process_group(
        "fake", store=FakeStore(), rank=rank, world_size=cfg.cluster.world_size
    )
    # Gloo groups cannot be created on the fake store (internal assert), and are not needed.
    initialize_parallel_state(cfg, create_gloo_groups=False)


def _stop_fake_rank() -> None:
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _coordinates(rank: int) -> RankCoordinates:
    return RankCoordinates(
        rank=rank,
        tp=parallel_state.get_tensor_model_parallel_rank(),
        pp=parallel_state.get_pipeline_model_parallel_rank(),
        dp=parallel_state.get_data_parallel_rank(),
        cp=parallel_state.get_context_parallel_rank(),
        ep=parallel_state.get_expert_model_parallel_rank(),
    )


def _build_on_meta(cfg: RunConfig, hooks) -> tuple[int, int, list[list[int]]]:
    from trainer.mcore_translation import build_transformer_config
    from trainer.model import build_model_chunks, distinct_parameter_counts

    config = build_transformer_config(cfg, cpu_initialization=True, meta_device=True)
    # Context parallelism shards activations, not weights; Megatron's local attention refuses
    # CP (only TE's supports it), so the shard is built with CP off: same parameters.
    config.context_parallel_size = 1
    with torch.device("meta"):
        chunks = build_model_chunks(cfg, config, hooks)
    layers = [[layer.layer_number for layer in chunk.decoder.layers] for chunk in chunks]
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    return (*distinct_parameter_counts(chunks, tp_rank), layers)


def collect_shards(cfg: RunConfig) -> list[ShardReport]:
    from plugins.attach import attach_plugins
    from plugins.cpu_runtime import activate_cpu_runtime

    # Without CUDA the model is Megatron's local spec, which needs the CPU runtime's patches
    # (e.g. MoE dispatchers create CUDA streams in their constructors).
    hooks = attach_plugins(cfg, cpu_runtime_active=activate_cpu_runtime(cfg.plugins.cpu_runtime))
    shards: dict[tuple[int, int, int], ShardReport] = {}
    for rank in range(cfg.cluster.world_size):
        _start_fake_rank(cfg, rank)
        try:
            coords = _coordinates(rank)
            key = coords.shard_key()
            if key not in shards:
                shards[key] = ShardReport(coords, *_build_on_meta(cfg, hooks))
            shards[key].ranks.append(rank)
        finally:
            _stop_fake_rank()
    return sorted(shards.values(), key=lambda s: s.coords.shard_key())


def model_parameters(shards: list[ShardReport]) -> int:
    """Whole-model parameters: dense weights are copied over EP ranks, experts are not."""
    dense = sum(s.dense_parameters for s in shards if s.coords.ep == 0)
    return dense + sum(s.expert_parameters for s in shards)


def _placement_ranges(ranks: list[int], gpus_per_node: int) -> str:
    """Compact N0:G0-G7 style list of where the given ranks sit."""
    by_node: dict[int, list[int]] = {}
    for rank in sorted(ranks):
        by_node.setdefault(rank // gpus_per_node, []).append(rank % gpus_per_node)
    parts = []
    for node, gpus in by_node.items():
        span = f"G{gpus[0]}" if len(gpus) == 1 else f"G{gpus[0]}-G{gpus[-1]}"
        contiguous = gpus == list(range(gpus[0], gpus[-1] + 1))
        parts.append(f"N{node}:" + (span if contiguous else ",".join(f"G{g}" for g in gpus)))
    return " ".join(parts)


def _layer_text(layers: list[list[int]]) -> str:
    return " | ".join(f"{chunk[0]}-{chunk[-1]}" if chunk else "-" for chunk in layers)


def _range_text(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def print_report(cfg: RunConfig, shards: list[ShardReport], seconds: float, console) -> None:
    """One row per pipeline stage (and expert rank): layers, parameters per rank, placement."""
    from trainer.summary import describe_run_layout

    groups: dict[tuple[int, int], list[ShardReport]] = {}
    for shard in shards:
        groups.setdefault((shard.coords.pp, shard.coords.ep), []).append(shard)
    table = Table(title=f"dry run: {cfg.name}, {describe_run_layout(cfg)}")
    for column in ("PP stage", "EP rank", "TP ranks", "layers (per virtual stage)",
                   "parameters / rank", "placement (Megatron rank order)"):
        table.add_column(column)
    for (stage, ep), members in sorted(groups.items()):
        ranks = [rank for shard in members for rank in shard.ranks]
        table.add_row(
            str(stage), str(ep), _range_text([m.coords.tp for m in members]).replace(",", ""),
            _layer_text(members[0].layers), _range_text([m.parameters for m in members]),
            _placement_ranges(ranks, cfg.cluster.gpus_per_node),
        )
    console.print(table)
    console.print(
        f"{len(shards)} distinct shards on {cfg.cluster.world_size} ranks; model parameters "
        f"(dense once, experts over all EP ranks): {model_parameters(shards):,}; "
        f"built in {seconds:.1f} s"
    )


def run_dry_run(cfg: RunConfig, console: Console | None = None) -> list[ShardReport]:
    from trainer.metrics import make_console

    start = time.perf_counter()
    shards = collect_shards(cfg)
    print_report(cfg, shards, time.perf_counter() - start, console or make_console())
    return shards

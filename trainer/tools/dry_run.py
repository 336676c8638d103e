"""Dry run: every distinct rank of a big layout, built for real on one CPU with no memory.

The run's `Layout` says which ranks hold the same model shard (equal TP x PP x EP
coordinates). For the first rank of each distinct shard one process starts that rank on
torch's `fake` process-group backend, sets up Megatron's parallel state (checking it agrees
with the layout) and builds the real Megatron Core model chunks on the meta device; the other
ranks are copies. Placement (node:GPU of every rank) follows Megatron's rank order.

Before building, the layout is planned on the recipe's own cluster and refused in one line
when a rank cannot fit there, as a launch would refuse it: Megatron builds every layer of a
stage, so a layer count no GPU holds (`model.num_layers=99999999999999999999`) would otherwise
keep the dry run building silently for ever. torch and Megatron are imported only to build,
so that refusal comes in about a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from plugins.protocol.hooks import PluginSet
from recipes.config.layout import RankCoordinates
from recipes.config.schema import RunConfig


@dataclass
class ShardReport:
    """What one distinct model shard holds, and every rank that holds a copy of it."""

    coords: RankCoordinates
    dense_parameters: int  # excluding copies of weights another shard already holds
    expert_parameters: int
    layers: list[list[int]]  # global layer numbers (1-based) per virtual stage
    held_parameters: int  # every parameter element the rank allocates, copies included
    ranks: list[int] = dataclasses.field(default_factory=list)
    mtp_layers: int = 0  # MTP depths (weights of their own) this shard's last chunk holds

    @property
    def parameters(self) -> int:
        return self.dense_parameters + self.expert_parameters


@contextlib.contextmanager
def _fake_rank(cfg: RunConfig, coords: RankCoordinates) -> Iterator[None]:
    """Rank `coords.rank` on torch's `fake` backend with Megatron's parallel state set up, checked
    to put the rank where the layout does; both torn down on the way out."""
    import torch
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainer.mcore_translation import initialize_parallel_state

    torch.distributed.init_process_group(
        "fake", store=FakeStore(), rank=coords.rank, world_size=cfg.layout.world_size
    )
    try:
        # Gloo groups cannot be created on the fake store (internal assert), and are not needed.
        initialize_parallel_state(cfg.layout, create_gloo_groups=False)
        if cfg.model.is_hybrid:
            # The Mamba mixer draws its conv and dt weights inside the model-parallel RNG
            # tracker's fork even on the meta device (`ssm/mamba_mixer.py:318, 366`).
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(cfg.train.seed)
        _check_coordinates(coords)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def _check_coordinates(coords: RankCoordinates) -> None:
    """The layout placed this rank where Megatron's own parallel state puts it."""
    from megatron.core import parallel_state

    megatron = (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_expert_model_parallel_rank(),
    )
    if megatron != (coords.tp, coords.pp, coords.ep):
        raise RuntimeError(f"layout puts rank {coords.rank} at (tp, pp, ep) = "
                           f"{(coords.tp, coords.pp, coords.ep)}, Megatron at {megatron}")


def _build_on_meta(cfg: RunConfig, plugins: PluginSet) -> tuple:
    import torch
    from megatron.core import parallel_state

    from trainer.mcore_translation import build_transformer_config
    from trainer.model import (
        build_model_chunks,
        distinct_parameter_counts,
        transformer_engine_in_use,
    )

    # On the meta device the shard is built with CP off (mcore_translation): CP shards
    # activations, not weights, so the parameters are the same. Transformer Engine's layers
    # take their device from the config: CPU initialisation would allocate them for real
    # (`extensions/transformer_engine.py:403-413`), so with TE they are told the meta device.
    te = transformer_engine_in_use(cfg)
    config = build_transformer_config(cfg, cpu_initialization=not te, meta_device=True,
                                      transformer_engine=te)

    config = plugins.transformer_config(config)
    with torch.device("meta"):
        chunks = build_model_chunks(cfg, config, plugins)
    layers = [[layer.layer_number for layer in chunk.decoder.layers] for chunk in chunks]
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    held = sum(param.numel() for chunk in chunks for param in chunk.parameters())
    mtp = sum(len(chunk.mtp.layers) for chunk in chunks if getattr(chunk, "mtp_process", False))
    return (*distinct_parameter_counts(chunks, tp_rank), layers, held, [], mtp)


def _build_shard(cfg: RunConfig, plugins: PluginSet, coords: RankCoordinates) -> ShardReport:
    """The real model chunks of one rank, built on the meta device under a fake process group."""
    with _fake_rank(cfg, coords):
        return ShardReport(coords, *_build_on_meta(cfg, plugins))


# Shards already built in this process, by `shard_signature` (recipes that differ only in
# DP, CP or batch, like the three Llama 3.1 405B layouts, hold the same shards).
_BUILT: dict[str, dict[tuple[int, int, int], ShardReport]] = {}


def shard_signature(small_cfg: RunConfig) -> str:
    """What decides the shards' parameters: the model (its sequence length only for learned
    position embeddings), the parallel sizes, precision and plugins; not the run's name,
    batch, optimizer or data."""
    from recipes.config.io import config_dict

    values = config_dict(small_cfg)
    if values["model"]["position_embedding"] != "learned_absolute":
        values["model"].pop("seq_length")
    keep = ("model", "parallel", "precision", "plugins", "cluster")
    return json.dumps({key: values[key] for key in keep}, sort_keys=True)


def _place_rank(cfg: RunConfig, coords: RankCoordinates) -> None:
    """Check where Megatron's parallel state puts a rank, without building its model."""
    with _fake_rank(cfg, coords):
        pass


def _distinct_shards(small_cfg: RunConfig, plugins: PluginSet) -> dict:
    """Each distinct shard of the small world, built once per process and signature.

    The shards of one (PP, TP) position on other EP ranks hold other experts of the same
    shapes (Megatron splits the experts evenly over EP: `moe/moe_layer.py:185` asserts
    `num_moe_experts % ep_size == 0`), so one is built and the others
    take its counts after their placement is checked: Nemotron 3 Super's 64 EP shards took a
    minute and a half to build one by one."""
    signature = shard_signature(small_cfg)
    if signature not in _BUILT:
        built: dict[tuple[int, int, int], ShardReport] = {}
        twins: dict[tuple[int, int], ShardReport] = {}
        for rank in range(small_cfg.layout.world_size):
            coords = small_cfg.layout.coordinates(rank)
            if coords.shard_key() in built:
                continue
            twin = twins.get((coords.pp, coords.tp))
            if twin is None:
                twin = twins[coords.pp, coords.tp] = _build_shard(small_cfg, plugins, coords)
            else:
                _place_rank(small_cfg, coords)
            built[coords.shard_key()] = dataclasses.replace(twin, coords=coords, ranks=[])
        _BUILT[signature] = built
    return _BUILT[signature]


def collect_shards(cfg: RunConfig) -> list[ShardReport]:
    """Every distinct shard of the layout, each built once, with the ranks holding a copy.

    The shards are built in the smallest world that has them all (`shard_world`: DP and CP
    change no rank's weights): Megatron's parallel-state set-up creates every group of the
    world on each fake rank, which at 16,384 ranks costs seconds per shard. Each report then
    carries the coordinates and the ranks of the full layout."""
    from plugins.registry import build_plugins
    from recipes.plan.command import shard_world
    from trainer.cpu_runtime.runtime import runtime_for

    # The runtime as on a real rank: without CUDA the model is Megatron's local spec, which
    # needs the CPU runtime's patches (MoE dispatchers create CUDA streams).
    plugins = build_plugins(cfg)
    plugins.setup_runtime(runtime_for(cfg.cluster, dry_run=True))
    built = _distinct_shards(shard_world(cfg), plugins)
    shards: dict[tuple[int, int, int], ShardReport] = {}
    layout = cfg.layout
    for rank in range(layout.world_size):
        coords = layout.coordinates(rank)
        key = coords.shard_key()
        if key not in shards:
            shards[key] = dataclasses.replace(built[key], coords=coords, ranks=[])
        shards[key].ranks.append(rank)
    return sorted(shards.values(), key=lambda s: s.coords.shard_key())


def model_parameters(shards: list[ShardReport], expert_tensor: int | None = None) -> int:
    """Whole-model parameters, each weight once: the dense weights of one shard per (PP, TP)
    pair (they are copied over EP ranks), the expert weights of one per (PP, EP, expert-TP)
    coordinate (`expert_tensor`: the expert-TP size; None = TP, experts split as TP splits).
    Expert-TP varies fastest in the expert grid, so a rank's expert-TP index is rank % size."""
    dense: dict[tuple[int, int], int] = {}
    experts: dict[tuple[int, int, int], int] = {}
    for s in shards:
        dense.setdefault((s.coords.pp, s.coords.tp), s.dense_parameters)
        etp = s.coords.tp if expert_tensor is None else s.coords.rank % expert_tensor
        experts.setdefault((s.coords.pp, s.coords.ep, etp), s.expert_parameters)
    return sum(dense.values()) + sum(experts.values())


def active_parameters(shards: list[ShardReport], cfg: RunConfig) -> int:
    """Parameters one token runs through, from the built shards: every weight but, of the
    routed experts, only the top-k of each MoE layer's experts (the shards' expert weights are
    all routed experts; shared experts are dense weights)."""
    expert_tensor = cfg.layout.expert_tensor_size
    total = model_parameters(shards, expert_tensor)
    m = cfg.model
    if m.num_moe_experts is None:
        return total
    experts = total - model_parameters(
        [dataclasses.replace(s, expert_parameters=0) for s in shards], expert_tensor)
    return total - experts * (m.num_moe_experts - m.moe_router_topk) // m.num_moe_experts


def _layer_text(layers: list[list[int]], cfg: RunConfig | None = None, mtp: int = 0) -> str:
    """Each virtual stage's layers; then the MTP depths the last one holds (`+ MTP 2 x *E`,
    or `1 x *E run 2 times` when the depths share one layer)."""
    text = " | ".join(f"{chunk[0]}-{chunk[-1]}" if chunk else "-" for chunk in layers)
    if not mtp or cfg is None:
        return text
    from recipes.models.hybrid.pattern import mtp_depths, mtp_pattern

    pattern = cfg.model.hybrid_layer_pattern
    runs = mtp_depths(pattern)
    shared = f" run {runs} times" if runs != mtp else ""
    return f"{text} + MTP {mtp} x {mtp_pattern(pattern)}{shared}"


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
            _layer_text(members[0].layers, cfg, members[0].mtp_layers),
            _range_text([m.parameters for m in members]),
            cfg.layout.placement(ranks),
        )
    console.print(table)
    active = (f", active per token {active_parameters(shards, cfg):,}"
              if cfg.model.num_moe_experts else "")
    console.print(
        f"{len(shards)} distinct shards on {cfg.cluster.world_size} ranks; model parameters "
        f"(each weight once): {model_parameters(shards, cfg.layout.expert_tensor_size):,}"
        f"{active}; built in {seconds:.1f} s"
    )


def check_buildable(cfg: RunConfig) -> list[str]:
    """The plan's fit on the recipe's own cluster, before any shard is built: a layout whose
    worst rank cannot fit a GPU there is refused in the one line a launch gets (the plan's
    refusal), since Megatron builds a stage's layers one by one and an absurd layer count
    would build for ever. The plan's warnings (TP or CP groups across nodes) otherwise."""
    from plugins.protocol.errors import ConfigError
    from recipes.plan.build import PlanOptions, make_plan
    from recipes.plan.cluster import recipe_cluster
    from recipes.plan.fit import refusal

    plan = make_plan(cfg, recipe_cluster(cfg), PlanOptions(listed_groups=0))
    if not plan.fits:
        raise ConfigError(f"dry run: {refusal(plan)}")
    return plan.warnings


def run_dry_run(cfg: RunConfig, console: Console | None = None) -> list[ShardReport]:
    for line in check_buildable(cfg):  # before the build: a wrong layout is said first
        print(line, flush=True)
    from trainer.metrics import make_console  # torch: after the refusal of what cannot build

    start = time.perf_counter()
    shards = collect_shards(cfg)
    print_report(cfg, shards, time.perf_counter() - start, console or make_console())
    return shards

"""The planner's per-rank parameter counts equal the real Megatron Core model's, exactly.

For every registered recipe, a subprocess (the CPU runtime's patches and fake process groups
stay out of the test process) builds each distinct shard's real model on the meta device, as
the dry run does, and reports what the rank allocates (every parameter element) and what it
adds to the whole model (the dry run's count: replicated weights once). Every rank of every
recipe is then checked against `recipes.plan.params`, as exact integers. The shards are built
in the smallest world holding them all (`shard_world`: DP and CP change no rank's weights), so
the 16,384-rank recipes take seconds; the test also checks that world has every shard.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.plan.params import model_parameters, stage_layer_counts, stage_params
from recipes.registry import RECIPES, get_recipe

REPO = Path(__file__).resolve().parents[2]

PROBE = r'''
import json, sys
import torch
from megatron.core import parallel_state
from plugins.protocol.events import RuntimeContext
from plugins.registry import build_plugins
from recipes.plan.command import shard_world
from recipes.registry import get_recipe
from trainer.tools import dry_run
from trainer.mcore_translation import build_transformer_config
from trainer.model import build_model_chunks, distinct_parameter_counts

def shard(cfg, plugins, rank):
    dry_run._start_fake_rank(cfg, rank)
    try:
        config = build_transformer_config(cfg, cpu_initialization=True, meta_device=True)
        config = plugins.transformer_config(config)
        config.context_parallel_size = 1
        with torch.device("meta"):
            chunks = build_model_chunks(cfg, config, plugins)
        held = sum(p.numel() for chunk in chunks for p in chunk.parameters())
        tp = parallel_state.get_tensor_model_parallel_rank()
        dense, expert = distinct_parameter_counts(chunks, tp)
        layers = [len(chunk.decoder.layers) for chunk in chunks]
        return {"held": held, "distinct": dense + expert, "layers": layers}
    finally:
        dry_run._stop_fake_rank()

out, by_signature = {}, {}
for name in sys.argv[1:]:
    cfg = shard_world(get_recipe(name))  # same shards, DP and CP shrunk away
    signature = dry_run.shard_signature(cfg)  # recipes with the same shards: built once
    if signature not in by_signature:
        plugins = build_plugins(cfg.plugins)
        plugins.setup_runtime(RuntimeContext(dry_run=True))
        layout, built = cfg.layout, {}
        for rank in range(layout.world_size):
            key = layout.coordinates(rank).shard_key()
            if key not in built:
                built[key] = shard(cfg, plugins, rank)
        by_signature[signature] = [[list(k), v] for k, v in built.items()]
    out[name] = by_signature[signature]
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def real() -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *RECIPES], capture_output=True, text=True, cwd=REPO,
        timeout=900, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                          "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_rank_holds_what_the_plan_says(real, name):
    cfg = get_recipe(name)
    shards = {tuple(key): value for key, value in real[name]}
    counts, layers = stage_params(cfg), stage_layer_counts(cfg)
    assert set(shards) == {cfg.layout.coordinates(r).shard_key()
                           for r in range(cfg.layout.world_size)}
    for rank in range(cfg.layout.world_size):
        c = cfg.layout.coordinates(rank)
        built = shards[c.shard_key()]
        assert built["held"] == counts[c.pp].total, (name, rank)
        assert built["distinct"] == counts[c.pp].distinct(c.tp), (name, rank)
        assert built["layers"] == layers[c.pp], (name, rank)


@pytest.mark.parametrize("name", list(RECIPES))
def test_whole_model_adds_up(real, name):
    cfg = get_recipe(name)
    shards = {tuple(key): value for key, value in real[name]}
    dense = sum(v["distinct"] for k, v in shards.items() if k[2] == 0)
    if cfg.model.num_moe_experts:
        return  # expert weights are counted per EP rank by the dry run; covered above
    assert dense == model_parameters(cfg)

"""Subprocess body for test_plan_search.py: search two tiny recipes, then build a sample of the
listed layouts in the dry run and compare each shard with the plan (prints JSON).

Its own process, as the dry run activates the CPU runtime's process-wide patches.
"""

from __future__ import annotations

import json
import sys

from recipes.plan.build import make_plan
from recipes.plan.cluster import load_cluster
from recipes.plan.command import compare_shards, shard_world
from recipes.plan.search import apply_candidate, search
from recipes.registry import get_recipe
from trainer.tools.dry_run import collect_shards


def probe(name: str, cluster_file: str, sample: int) -> list[dict]:
    cfg, cluster = get_recipe(name), load_cluster(cluster_file)
    result = search(cfg, cluster, top=40)
    picked = result.listed[:: max(1, len(result.listed) // sample)][:sample]
    found = []
    for evaluated in picked:
        layout = apply_candidate(cfg, evaluated.candidate)
        shards = collect_shards(shard_world(layout))
        line = compare_shards(make_plan(layout, cluster), shards, 0.0)[0]
        found.append({"layout": evaluated.candidate.describe(), "verify": line})
    return found


if __name__ == "__main__":
    names = sys.argv[1:]
    print(json.dumps({name: probe(name, "conf/cluster/cpu_local.yaml", 2) for name in names}))

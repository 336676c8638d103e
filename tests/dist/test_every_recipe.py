"""Every registered recipe that fits this CPU machine trains, on a fresh clone.

The recipes come from the registry, so one added later is picked up. The local launcher's own
machine check (`recipes/config/machine.py`), asked about a machine with no GPU and no multi-node
launch, sorts them: those it refuses need more ranks or GPUs than it starts on CPU and are
skipped, each with the launcher's reason. Every other one is launched as `scripts/pretrain.py
recipe=NAME` launches it, shortened (one step per phase, no held-out evaluation, no checkpoint,
a small built-in corpus), from a folder holding the repository's tracked files and nothing
else: the launching process prepares what the recipe's blends name (`prepare:`), checks paths,
machine and fit and saves the config (`ready_to_launch`); its ranks, forked by the session's
fork server, run pretrain.py's rank path on that config. A data or tokenizer path that moves, a
blend that no longer prepares, or a recipe that no longer resolves or trains fails here. Data
is not a reason to skip: a CPU-sized recipe a fresh clone cannot feed is what this catches.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.machine import CPU_RANK_CAP, MachineInfo, check_machine
from recipes.config.phases import launch_stop
from recipes.config.schema import RunConfig
from recipes.registry import RECIPES, get_recipe
from tests.dist.conftest import REPO_ROOT

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.recipe_runs:pretrain_as_rank"
CPU_MACHINE = MachineInfo(gpus=0, launched_world_size=None)
CORPUS_BYTES = 120_000  # of the built-in corpus, read by the ranks or prepared into a blend


def cpu_refusal(cfg: RunConfig) -> str | None:
    """Why the local launcher cannot run `cfg` on a CPU-only machine, or None."""
    try:
        check_machine(cfg, CPU_MACHINE)
    except ConfigError as error:
        return str(error)
    return None


def needs_more_ranks(cfg: RunConfig) -> bool:
    """More nodes than one, or more ranks than the CPU runtime starts on one machine, or a
    plugin that needs GPUs (FP8, through Transformer Engine)."""
    return cfg.cluster.nodes > 1 or cfg.cluster.world_size > CPU_RANK_CAP or any(
        config.machine_problem(cfg, CPU_MACHINE, True) for _, config in cfg.plugins.configs())


def short_run(cfg: RunConfig, output_dir: Path) -> list[str]:
    """Overrides that make the recipe's run one step per phase, on its own data."""
    relaunches = any(phase.relaunch for phase in cfg.phases)
    return [f"train.train_iters={max(1, len(cfg.phases))}", "scheduler.warmup_iters=0",
            "train.eval_interval=0", "train.eval_iters=0",
            *([] if relaunches else ["checkpoint.save=false"]),  # relaunches start from saves
            f"data.max_corpus_bytes={CORPUS_BYTES}", "logging.progress_bar=false",
            f"output_dir={output_dir}"]


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """A folder holding what a clone holds: a link to each tracked top-level entry of the
    repository (no data_cache/, no runs)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True).stdout.split("\0")
    folder = tmp_path_factory.mktemp("clone")
    for name in sorted({path.split("/")[0] for path in tracked if path}):
        (folder / name).symlink_to(REPO_ROOT / name)
    return folder


def test_skipped_recipes_are_exactly_those_needing_more_ranks_or_gpus():
    configs = {name: get_recipe(name) for name in RECIPES}
    skipped = {name: reason for name, cfg in configs.items() if (reason := cpu_refusal(cfg))}
    print("\n".join(f"skipped {name}: {reason}" for name, reason in skipped.items()))
    print("trained:", ", ".join(name for name in configs if name not in skipped))
    assert set(skipped) == {name for name, cfg in configs.items() if needs_more_ranks(cfg)}
    assert len(skipped) < len(configs)


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_trains_on_a_fresh_clone(name, launch_ranks, fresh_clone, monkeypatch, tmp_path):
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import parse_arguments
    from trainer.entry.pipeline import rank_arguments, ready_to_launch, resolve

    recipe = get_recipe(name)
    if reason := cpu_refusal(recipe):
        pytest.skip(f"needs more ranks or GPUs than the local launcher starts on CPU: {reason}")
    monkeypatch.chdir(fresh_clone)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the machine the ranks run on: CPU
    args = parse_arguments(PRETRAIN, [f"recipe={name}", *short_run(recipe, tmp_path)])
    cfg, run_dir, on_gpu = ready_to_launch(resolve(args), args)
    assert not on_gpu
    launch_ranks(cfg.layout.world_size, ENTRY,
                 {"argv": rank_arguments(run_dir, args), "cwd": str(fresh_clone)})
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if record["kind"] == "train"]
    # A run whose later phases are launches of their own trains up to the first of them here.
    assert [record["step"] for record in steps] == list(range(1, launch_stop(cfg, 0) + 1))
    assert all(math.isfinite(record["loss"]) for record in steps)

"""`scripts/pretrain.py`: resolve -> validate -> check the machine -> (dry run | launch | train).

The parent process imports no torch until the configuration is known to be valid, so a wrong
recipe or a wrong machine is refused in about a second with one line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from recipes.config_io import save_config
from recipes.errors import ConfigError
from recipes.machine import check_machine, detect_machine
from recipes.registry import format_recipe_list
from recipes.resolve import ListRecipesRequested, resolve_config
from recipes.schema import RunConfig

PRETRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pretrain.py"


def choose_run_dir(cfg: RunConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    # Every rank of an external launch must agree on the directory: use the launcher's run id.
    suffix = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output_dir) / f"{cfg.name}-{suffix}"


def prepare_run_dir(cfg: RunConfig) -> tuple[RunConfig, Path]:
    """Create the run directory and save the resolved config there.

    The saved file leaves `run_dir` unset, so `config=<that file>` reproduces the run into a
    new directory; the ranks of this run get the directory as an explicit override.
    """
    run_dir = choose_run_dir(cfg).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("RANK", "0") == "0":
        save_config(dataclasses.replace(cfg, run_dir=None), run_dir / "config.yaml")
    return dataclasses.replace(cfg, run_dir=str(run_dir)), run_dir


def run_pretrain(argv: list[str]) -> int:
    from trainer.launch import under_launcher

    try:
        cfg = resolve_config(argv)
    except ListRecipesRequested:
        print(format_recipe_list())
        return 0
    if cfg.dry_run:
        from trainer.dry_run import run_dry_run

        run_dry_run(cfg)
        return 0
    check_machine(cfg, detect_machine(), argv)
    cfg, run_dir = prepare_run_dir(cfg)
    if under_launcher():
        from trainer.entry import main_for_rank

        return main_for_rank(cfg, run_dir)
    from trainer.launch import launch_local_ranks

    print(f"launching {cfg.cluster.world_size} local ranks; outputs in {run_dir}", flush=True)
    return launch_local_ranks(
        cfg.cluster.world_size,
        PRETRAIN_SCRIPT,
        [f"config={run_dir / 'config.yaml'}", f"run_dir={run_dir}"],
        cfg.plugins.cpu_runtime.threads_per_rank,
    )


def main(argv: list[str] | None = None) -> int:
    from trainer.entry import quiet_library_noise

    quiet_library_noise()
    try:
        return run_pretrain(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr)
        return 2

"""`scripts/bench_step.py`: launch local ranks and compare step times (see trainer.benchmark)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from recipes.errors import ConfigError
from recipes.resolve import resolve_config

BENCH_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_step.py"


def _split_bench_args(argv: list[str]) -> tuple[dict[str, int], list[str]]:
    counts = {"steps": 20, "warmup": 3}
    rest = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in counts:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{key}={value} must be a positive whole number, e.g. {key}=20")
            counts[key] = int(value)
        else:
            rest.append(arg)
    return counts, rest


def run_bench_rank(argv: list[str]) -> None:
    import torch

    from trainer.benchmark import compare_step_times
    from trainer.entry import start_session

    counts, rest = _split_bench_args(argv)
    cfg = resolve_config(rest)
    cfg.checkpoint.save = False
    session = start_session(cfg, Path(tempfile.mkdtemp(prefix="bench-")))
    figures = compare_step_times(session, counts["steps"], counts["warmup"])
    if torch.distributed.get_rank() == 0:
        print(
            f"bench {cfg.name}: ours {figures['ours_s'] * 1e3:.1f} ms/step, bare Megatron Core "
            f"{figures['bare_s'] * 1e3:.1f} ms/step, ratio {figures['ratio']:.3f} "
            f"(median of {figures['steps']} after {figures['warmup']} warm-up)"
        )
        print(json.dumps(figures))
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from trainer.entry import quiet_library_noise
    from trainer.launch import launch_local_ranks, under_launcher

    quiet_library_noise()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if under_launcher():
            run_bench_rank(argv)
            return 0
        _, rest = _split_bench_args(argv)
        cfg = resolve_config(rest)
        return launch_local_ranks(
            cfg.cluster.world_size, BENCH_SCRIPT, argv, cfg.plugins.cpu_runtime.threads_per_rank
        )
    except ConfigError as error:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr)
        return 2

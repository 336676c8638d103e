"""Per-rank functions for the logging, profiler and multi-node tests (through `launch_ranks`).

`pretrain` runs what `scripts/pretrain.py` runs on each rank
(`trainer.entry.commands.pretrain_rank`: session, step loop with every hook, reporter writing
metrics.jsonl, `run_end`) on a recipe plus overrides, with small synthetic data so it takes
seconds.
"""

from __future__ import annotations

from pathlib import Path

from recipes.resolve import resolve_config
from trainer.checkpoint.preflight import validate_paths

SMALL_DATA = ["data.source=synthetic", "data.max_corpus_bytes=120000", "train.eval_iters=1",
              "checkpoint.save=false", "logging.progress_bar=false",
              "scheduler.warmup_iters=1"]


def pretrain(payload: dict) -> dict:
    """Train `payload['recipe']` with `payload['overrides']` into `payload['run_dir']`."""
    from trainer.entry.commands import pretrain_rank

    cfg = resolve_config([f"recipe={payload['recipe']}", *SMALL_DATA, *payload["overrides"]])
    validate_paths(cfg)
    run_dir = Path(payload["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    return {"exit": pretrain_rank(cfg, run_dir, None)}

"""How documents share samples, concatenate-and-cut against exact packing on the same corpus
(`scripts/bench_documents.py` is the usage): the layout figures from the blend's datasets, and
the step figures of short `scripts/pretrain.py` runs, one per mode, in one process, and each
mode's step time and effective tokens/s as a ratio to concatenate-and-cut's in the same run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

MODES = {
    "concatenate": [],
    "inter_document": ["data.documents=inter_document"],
    "packed": ["data.documents=packed"],
}


def layout_figures(blend_path: str, seq: int) -> dict[str, dict[str, float]]:
    """Cut documents, padding and efficiency of both ways to fill rows of `seq` tokens."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from data_prep.packing import pack_documents
    from recipes.config.blend import load_blend

    # Keep each dataset alive while its memory-mapped lengths are read (it unmaps on deletion).
    datasets = [IndexedDataset(prefix) for source in load_blend(blend_path).train
                for prefix in source.prefixes]
    lengths = np.concatenate([d.sequence_lengths.astype(np.int64) for d in datasets])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    cut = int(((starts // seq) != ((ends - 1) // seq)).sum())
    stats = pack_documents(lengths, seq, long_documents="split", seed=0).stats
    rows = stats.packs
    return {
        "concatenate": {"documents": len(lengths), "cut": cut, "padding": 0,
                        "efficiency": 1.0, "rows": int(ends[-1] // seq)},
        "packed": {"documents": len(lengths), "cut": stats.split_documents,
                   "padding": rows * seq - stats.tokens, "efficiency": stats.efficiency,
                   "rows": rows},
    }


def step_figures(recipe: str, blend: str, steps: int, mode: str) -> tuple[float, float]:
    """Median step time and effective tokens/s of a short run (first 2 steps discarded)."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, str(REPO / "scripts" / "pretrain.py"), f"recipe={recipe}",
                   "data.source=blend", f"data.blend={blend}", "train.micro_batch_size=1",
                   f"train.train_iters={steps}", "scheduler.warmup_iters=1",
                   "train.eval_interval=0", "train.eval_iters=0", "checkpoint.save=false",
                   "logging.progress_bar=false", f"run_dir={run_dir}", *MODES[mode]]
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if result.returncode != 0:
            raise SystemExit(result.stderr.strip().splitlines()[-1])
        records = [json.loads(line) for line in
                   (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"][2:]
    return (statistics.median(r["step_time_s"] for r in train),
            statistics.median(r["tokens_per_s"] for r in train))




def ratio_lines(steps: dict[str, tuple[float, float]]) -> list[str]:
    """Each mode's step time and effective tokens/s against concatenate-and-cut, measured in
    the same run (absolute figures of a shared machine drift between runs; ratios of runs side
    by side drift less)."""
    base_seconds, base_tokens = steps["concatenate"]
    return [f"ratio {mode} / concatenate: step time {seconds / base_seconds:.2f}, "
            f"effective tokens/s {tokens / base_tokens:.2f}"
            for mode, (seconds, tokens) in steps.items() if mode != "concatenate"]


def run_bench_documents(blend: str, steps: int, recipe: str) -> int:
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe

    seq = apply_overrides(get_recipe(recipe), []).model.seq_length
    figures = layout_figures(blend, seq)
    figures["inter_document"] = figures["concatenate"]
    print(f"{'mode':<15}{'documents':>10}{'cut/split':>10}{'padding':>10}{'efficiency':>11}"
          f"{'rows':>8}{'s/step':>9}{'tok/s':>9}")
    measured = {}
    for mode in MODES:
        seconds, tokens = measured[mode] = step_figures(recipe, blend, steps, mode)
        f = figures[mode]
        print(f"{mode:<15}{f['documents']:>10,}{f['cut']:>10,}{f['padding']:>10,}"
              f"{f['efficiency']:>10.2%}{f['rows']:>8,}{seconds:>9.3f}{tokens:>9,.0f}",
              flush=True)
    print("\n".join(ratio_lines(measured)))
    return 0

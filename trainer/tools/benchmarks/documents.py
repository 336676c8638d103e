"""How documents share samples, concatenate-and-cut against exact packing on the same corpus
(`scripts/bench_documents.py` is the usage): the layout figures from the blend's datasets, and
the step figures of short `scripts/pretrain.py` runs, one per mode, in one process, and each
mode's step time and effective tokens/s as a ratio to concatenate-and-cut's in the same run.

The bench takes the blend as a run would: its `prepare:` entries are made first when their
manifest is missing, and a recipe whose `model.vocab_size` is below the blend's vocabulary is
run with the blend's (`model.vocab_size=<N>`), so `blend=conf/data/python_stdlib.yaml` (a
2,048-token BPE) works with the default 256-token recipe, as its usage line shows. A mistake
(a bad blend, a refused run) is one `error:` line, exit 2.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from plugins.protocol.metrics_file import METRICS_FILE
from trainer.tools.benchmarks.child_runs import child_failure

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


def vocab_overrides(recipe_vocab: int, blend_vocab: int) -> list[str]:
    """What the runs need to read the blend's ids: its vocabulary when the recipe's is
    smaller (pretrain.py refuses ids beyond model.vocab_size), else nothing."""
    return [f"model.vocab_size={blend_vocab}"] if recipe_vocab < blend_vocab else []


def step_figures(recipe: str, blend: str, steps: int, mode: str,
                 overrides: tuple[str, ...] = ()) -> tuple[float, float]:
    """Median step time and effective tokens/s of a short run (first 2 steps discarded)."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, str(REPO / "scripts" / "pretrain.py"), f"recipe={recipe}",
                   "data.source=blend", f"data.blend={blend}", "train.micro_batch_size=1",
                   f"train.train_iters={steps}", "scheduler.warmup_iters=1",
                   "train.eval_interval=0", "train.eval_iters=0", "checkpoint.save=false",
                   "logging.progress_bar=false", f"run_dir={run_dir}", *overrides,
                   *MODES[mode]]
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if result.returncode != 0:
            raise child_failure("pretrain.py", result.returncode, result.stderr)
        records = [json.loads(line) for line in
                   (Path(run_dir) / METRICS_FILE).read_text().splitlines()]
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
    from data_prep.blend_prepare import prepare_missing_data
    from plugins.protocol.errors import ConfigError
    from recipes.config.blend import load_blend
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe

    example = "e.g. blend=conf/data/python_stdlib.yaml"
    if not blend:
        raise ConfigError(f"blend= is missing; name a blend file, {example}")
    if not Path(blend).is_file():  # the option's own name, not the data.blend= it becomes
        what = "is a directory" if Path(blend).is_dir() else "does not exist"
        raise ConfigError(f"blend={blend} {what}; name a blend file, {example}")
    cfg = apply_overrides(get_recipe(recipe), ["data.source=blend", f"data.blend={blend}"])
    prepare_missing_data(cfg)  # as pretrain.py would, before the blend is read
    overrides = tuple(vocab_overrides(cfg.model.vocab_size, load_blend(blend).vocab_size))
    if overrides:
        print(f"recipe {recipe}: {overrides[0]} (the blend's vocabulary; the recipe has "
              f"{cfg.model.vocab_size})", flush=True)
    seq = cfg.model.seq_length
    figures = layout_figures(blend, seq)
    figures["inter_document"] = figures["concatenate"]
    print(f"{'mode':<15}{'documents':>10}{'cut/split':>10}{'padding':>10}{'efficiency':>11}"
          f"{'rows':>8}{'s/step':>9}{'tok/s':>9}")
    measured = {}
    for mode in MODES:
        seconds, tokens = measured[mode] = step_figures(recipe, blend, steps, mode, overrides)
        f = figures[mode]
        print(f"{mode:<15}{f['documents']:>10,}{f['cut']:>10,}{f['padding']:>10,}"
              f"{f['efficiency']:>10.2%}{f['rows']:>8,}{seconds:>9.3f}{tokens:>9,.0f}",
              flush=True)
    print("\n".join(ratio_lines(measured)))
    return 0

"""Benchmark: how documents share samples — concatenate-and-cut vs exact packing, same corpus.

usage: python scripts/bench_documents.py blend=conf/data/<blend>.yaml [steps=N] [recipe=NAME]

    python scripts/bench_documents.py blend=conf/data/python_stdlib.yaml steps=20

For the blend's training datasets at the recipe's sequence length it prints, per mode:
documents cut across samples (concatenate: every document that straddles a sample boundary;
packing: documents longer than a pack, split), padding tokens, efficiency (document tokens /
row tokens), loss tokens per row, and the median step time and effective tokens/s of `steps`
training steps (micro-batch 1 in every mode, so the rows compare one to one). Modes:
`concatenate` (Megatron's GPTDataset: documents attend across the cut), `inter_document` (the
same samples, attention kept inside documents through cu_seqlens), `packed` (whole documents
packed best-fit-decreasing; padding fills the rest of a row).
"""

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODES = {
    "concatenate": [],
    "inter_document": ["data.documents=inter_document", "plugins.packing.enabled=true"],
    "packed": ["data.documents=packed", "plugins.packing.enabled=true"],
}


def parse(argv: list[str]) -> dict[str, str]:
    values = {"blend": "", "steps": "20", "recipe": "tiny_dp1"}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in values or not value:
            raise ValueError(f"'{arg}' is not one of blend=FILE, steps=N, recipe=NAME; "
                             "e.g. python scripts/bench_documents.py blend=conf/data/x.yaml")
        values[key] = value
    if not values["blend"] or not values["steps"].isdigit() or int(values["steps"]) < 3:
        raise ValueError("give blend=<file> and steps=N (N >= 3), e.g. "
                         "blend=conf/data/python_stdlib.yaml steps=20")
    return values


def layout_figures(blend_path: str, seq: int) -> dict[str, dict[str, float]]:
    """Cut documents, padding and efficiency of both ways to fill rows of `seq` tokens."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from data_prep.packing import pack_documents
    from recipes.config.blend import load_blend

    # Keep each dataset alive while its memory-mapped lengths are read (it unmaps on deletion).
    datasets = [IndexedDataset(s.prefix) for s in load_blend(blend_path).train]
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


def main(argv: list[str]) -> int:
    if any(arg in ("--help", "-h", "help") for arg in argv):
        print(__doc__.strip())
        return 0
    try:
        args = parse(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe

    seq = apply_overrides(get_recipe(args["recipe"]), []).model.seq_length
    figures = layout_figures(args["blend"], seq)
    figures["inter_document"] = figures["concatenate"]
    print(f"{'mode':<15}{'documents':>10}{'cut/split':>10}{'padding':>10}{'efficiency':>11}"
          f"{'rows':>8}{'s/step':>9}{'tok/s':>9}")
    for mode in MODES:
        seconds, tokens = step_figures(args["recipe"], args["blend"], int(args["steps"]), mode)
        f = figures[mode]
        print(f"{mode:<15}{f['documents']:>10,}{f['cut']:>10,}{f['padding']:>10,}"
              f"{f['efficiency']:>10.2%}{f['rows']:>8,}{seconds:>9.3f}{tokens:>9,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Per-rank function and data for the mixed-length phase test (run through `launch_ranks`).

The data: one blend of two prepared sources, long documents (most of a long row each) and short
ones (a sixteenth of a row or less), as Nemotron 3 Nano's long-context phase mixes 512k-token
and 4k-token sequences. `rows_attend_per_document` builds the session of that phase's own config
(`phase_config`: packed rows of `LONG_SEQ` tokens, micro-batch 1), takes its first global batch
from the real stream, and compares the loss of every row holding several documents with the
loss of each of its documents alone in a plain causal row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHORT_SEQ, LONG_SEQ = 64, 256  # the pretraining phase's rows and the long-context phase's
LONG_DOCS = (150, 250, 100)  # lengths from, to, and how many
SHORT_DOCS = (8, 16, 1000)


def write_mixed_blend(folder: Path, weights: tuple[float, float] = (1.0, 1.0)) -> str:
    """`long` and `short` byte-id datasets (EOD 0 ends each document) and a blend naming both,
    weighed by `weights`."""
    from tests.unit.dataset_fixtures import write_dataset

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    lines = ["train:"]
    for name, (low, high, count), weight in (("long", LONG_DOCS, weights[0]),
                                             ("short", SHORT_DOCS, weights[1])):
        documents = [[*rng.integers(1, 256, size=int(n) - 1).tolist(), 0]
                     for n in rng.integers(low, high + 1, size=count)]
        prefix = write_dataset(folder / name, documents)
        lines.append(f"  - {{prefix: {prefix}, weight: {weight}}}")
    path = folder / "mixed.yaml"
    path.write_text("\n".join([*lines, "split: [90, 10]", "eod_id: 0", "vocab_size: 256", ""]),
                    encoding="utf-8")
    return str(path)


def _documents(row: dict) -> list[np.ndarray]:
    """The documents of one packed row: its segments that carry a loss (the row's trailing
    padding is a segment of its own with none)."""
    tokens = row["tokens"].reshape(-1).numpy()
    mask = row["loss_mask"].reshape(-1).numpy()
    bounds = row["cu_seqlens"].reshape(-1).tolist()
    return [tokens[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if mask[a:b].any()]


def _loss(session, microbatches: list[dict], plugins) -> list[float]:
    """[summed loss, loss tokens] of one forward and backward over `microbatches`."""
    from trainer.step import run_schedule

    for chunk in session.model:
        chunk.zero_grad_buffer()
    reports = run_schedule(session.model, microbatches, plugins, seq_length=LONG_SEQ,
                           micro_batch_size=1, forward_only=False)
    total = sum(report["lm loss"] for report in reports)
    return [float(total[0]), int(total[1])]


def rows_attend_per_document(payload: dict) -> dict:
    from plugins.protocol.hooks import PluginSet
    from plugins.protocol.packed_batch import packed_row
    from recipes.config.phases import phase_config, phase_spans
    from recipes.resolve import resolve_config
    from trainer.data import as_tensors
    from trainer.session import start_session

    cfg = resolve_config(payload["argv"])
    long_phase = phase_spans(cfg)[-1]
    phase = phase_config(cfg, long_phase)
    phase.checkpoint.save = False
    phase.logging.progress_bar = False
    session = start_session(phase, Path(payload["run_dir"]))
    rows = session.train_batches.take()
    plain = PluginSet([p for p in session.plugins if p.name != "packing"])
    found = []
    for row in rows:
        documents = _documents(row)
        alone = [{key: value for key, value in as_tensors(packed_row(
            [doc], LONG_SEQ, pad_id=0)).items()
            if key in ("tokens", "labels", "loss_mask", "position_ids")} for doc in documents]
        packed = _loss(session, [row], session.plugins)
        causal = _loss(session, [row], plain)  # control: the same row attending across all
        found.append({"lengths": [int(d.size) for d in documents], "packed": packed,
                      "alone": _loss(session, alone, plain), "causal_only": causal})
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    return {"plugins": [p.name for p in session.plugins], "rows": found,
            "phase": {"seq_length": phase.model.seq_length, "documents": phase.data.documents,
                      "micro_batch_size": phase.train.micro_batch_size}}

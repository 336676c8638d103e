"""A small prepared dataset for the data tests: synthetic documents, byte-level ids, written with
Megatron Core's `IndexedDatasetBuilder` (as scripts/prepare_data.py writes them), plus a blend
file naming it. Byte ids keep the tiny recipes' vocabulary (256; EOD is 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data_prep.byte_tokenizer import ByteTokenizer
from data_prep.corpus import synthetic_documents


def write_byte_dataset(folder: Path, name: str = "synthetic", max_bytes: int = 120_000,
                       seed: int = 7) -> str:
    """Write `<folder>/<name>.bin/.idx` (one sequence per document, EOD appended); the prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / name)
    tokenizer = ByteTokenizer()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for text in synthetic_documents(max_bytes, seed=seed):
        ids = np.append(tokenizer.encode(text), tokenizer.eod).astype(np.int64)
        builder.add_document(torch.from_numpy(ids), [len(ids)])
    builder.finalize(prefix + ".idx")
    return prefix


def write_blend(folder: Path, prefix: str, split: tuple[int, int] = (90, 10)) -> str:
    """A blend file naming one prefix, with the byte tokenizer's EOD and vocabulary."""
    path = folder / "blend.yaml"
    path.write_text(
        f"train:\n  - {{prefix: {prefix}, weight: 1.0}}\nsplit: [{split[0]}, {split[1]}]\n"
        "eod_id: 0\nvocab_size: 256\n", encoding="utf-8"
    )
    return str(path)


def train_steps_on_packs_padded_for(payload: dict) -> dict:
    """Rank entry: `tests.dist.layout_runs.train_steps` on the pack index made for the pad
    multiple `payload['index_pad_multiple']` (what a run at CP = multiple / 2 reads), its rows
    built without per-document padding: the same documents in the same rows, as plain packed
    rows, the reference a context-parallel run on that index must equal. The trainer picks the
    index by the run's own CP size, so this rank swaps the index lookup (this process only)."""
    from tests.dist import layout_runs
    from trainer import data

    multiple, find = payload["index_pad_multiple"], data._pack_index
    data._pack_index = lambda prefix, seq, seed, _multiple, **named: find(prefix, seq, seed,
                                                                       multiple, **named)
    return layout_runs.train_steps(payload)


def prepare_corpus(folder: Path, num_shards: int, tokenizer: str) -> object:
    """`scripts/prepare_data.py` on one small JSONL corpus (made once in `folder/corpus`):
    `num_shards` train shards and one valid shard; the `PrepareResult`."""
    import json

    from data_prep.config import PrepareConfig
    from data_prep.prepare import prepare

    corpus = folder / "corpus"
    if not corpus.is_dir():
        corpus.mkdir(parents=True)
        documents = list(synthetic_documents(240_000, seed=11))
        for index, part in enumerate((documents[::2], documents[1::2])):
            (corpus / f"part-{index}.jsonl").write_text(
                "".join(json.dumps({"text": text}) + "\n" for text in part), encoding="utf-8")
    output = folder / f"shards_{num_shards}" / "corpus"
    return prepare(PrepareConfig(input=str(corpus), output=str(output), tokenizer=tokenizer,
                                 num_shards=num_shards, valid_shards=1, held_out_fraction=0.1),
                   progress=False)


def train_and_hold_out(payload: dict) -> dict:
    """Rank entry: the per-step records of `tests.dist.resume_runs` (loss, lr, tokens, a digest
    of the token ids) over `payload['steps']` steps, then a digest of each held-out batch and
    the held-out loss."""
    from tests.dist.layout_runs import _finish, _session
    from tests.dist.resume_runs import _digest, _train
    from trainer.step import evaluate

    session = _session(payload)
    records = _train(session, payload["steps"])
    heldout = [_digest(session.heldout_batches.microbatches(k))
               for k in range(session.eval_steps)]
    result = evaluate(session)
    _finish()
    return {"records": records, "heldout": heldout, "eval_loss": result.loss}


def open_pack_index(payload: dict) -> dict:
    """Rank entry: the trainer's `_pack_index` on `payload['prefix']` (row length
    `payload['seq']`); what this rank was told (the one-line error, or the packs it sees) and how
    many times it read the index's pieces (`index_problem`), counted in this process only. With
    `payload['record']` (a folder) rank 0 keeps the run's record of checked indexes there."""
    from data_prep import packing
    from plugins.protocol.errors import ConfigError
    from trainer import data
    from trainer.pack_checks import CheckedIndexes

    reads, check = [], packing.index_problem
    packing.index_problem = lambda *args: reads.append(1) or check(*args)
    checked = (CheckedIndexes(Path(payload["record"]))
               if payload.get("record") and torch.distributed.get_rank() == 0 else None)
    try:
        _, index = data._pack_index(payload["prefix"], payload["seq"], 1234, 1, checked=checked)
    except ConfigError as error:
        return {"error": str(error), "reads": len(reads)}
    if checked is not None:
        checked.save()
    return {"packs": len(index), "first": index.pack(0)[2].tolist(), "reads": len(reads)}


def packed_rows_of(payload: dict) -> list[dict]:
    """Rank entry: the trainer's packed sources of `payload['blend']` (`data.packed_sources`)
    under each of `payload['runs']` (lists of overrides, one cache folder each): per split, each
    row's (source, pack of that source counted from the source's first pack), and each source's
    pack count."""
    from recipes.config.blend import load_blend
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe
    from trainer import data

    def rows(samples) -> list[list[int]]:
        return [[int(s), int(p) + int(samples.first[s])]
                for s, p in zip(samples.sources, samples.packs, strict=True)]

    found = []
    for number, overrides in enumerate(payload["runs"]):
        cfg = apply_overrides(get_recipe("tiny_dp1"), [
            "data.source=blend", f"data.blend={payload['blend']}", "data.documents=packed",
            "train.micro_batch_size=1", *overrides])
        train, heldout = data.packed_sources(cfg, load_blend(cfg.data.blend),
                                             Path(payload["cache"]) / str(number))
        found.append({"train": rows(train), "heldout": rows(heldout),
                      "counts": [len(table) for table in train.tables]})
    return found

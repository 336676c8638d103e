"""A preparation cut into shards, each written by one task, each task redone only if incomplete.

Why it is built this way:
- The plan is made from the inputs alone (their documents' text sizes, in input order), before
  any tokenizing, so it is the same whatever runs the tasks and however many workers there are:
  `num_shards=N` cuts a source's documents, in document order, into N shards of about equal
  text (so about equal tokens); `valid_shards` / `test_shards` do the same with every
  `1/held_out_fraction`-th document set aside for each; without `num_shards` a shard is one
  input file (today's layout, and `shard_size` still starts a new dataset every N documents).
- A task (`run_task`) is a plain picklable value and a module-level function: the local process
  pool and Ray run exactly the same code, and a task reads its rows from the Arrow files the
  driver converted once, so workers never parse the inputs again.
- Each task writes its datasets in the hidden work folder, publishes them by rename, then writes
  its record (`<output>.shards/<prefix>.json`: the plan's key, sizes, the `.idx` CRC-32 and the
  `.bin` CRC-32 computed while writing) by rename too. A shard is complete when its record
  names this plan and its files still match the record (sizes, index CRC-32, bounded `.bin`
  fingerprint): a killed run (driver or worker) leaves at worst a stale work file, and the
  same command redoes only the shards that are not complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recipes.config import dataset_files

ENCODE_BATCH = 1000  # documents per encode_batch call
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one input file; `first` is the first row's document number."""

    file: int
    start: int
    stop: int
    first: int


@dataclass(frozen=True)
class ShardPlan:
    """One task: the rows it reads, which of them belong to its split, the dataset names."""

    prefix: str  # the (first) dataset's name, relative to the output's folder
    split: str
    source: str  # the input file(s) it reads, for the summary
    pieces: tuple[Piece, ...]
    stride: int  # held-out selection: document g is valid if g % stride == stride - 1,
    held_out: tuple[str, ...]  # test if g % stride == stride - 2 (for the splits listed)
    shard_size: int | None = None  # documents per dataset inside the task (files layout only)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a worker needs, by value (picklable for a process pool and for Ray)."""

    plan: ShardPlan
    key: str  # the plan's identity: a record with another key is not this shard
    arrow_files: tuple[tuple[str, ...], ...]  # per input file, the Arrow files datasets wrote
    column: str
    tokenizer_json: str
    eod_id: int
    dtype: str
    keep_empty: bool
    output_dir: str
    work_dir: str
    records_dir: str


@dataclass
class _Dataset:
    """One dataset being written: Megatron Core's builder and the running CRC of the tokens."""

    prefix: str
    builder: Any
    part: Path
    documents: int = 0
    empty: int = 0
    tokens: int = 0
    bin_crc32: int = 0
    sources: set = field(default_factory=set)


# ----------------------------------------------------------------------------- planning


def held_out_stride(fraction: float) -> int:
    """Every stride-th document is held out for each held-out split (1% -> every 100th)."""
    return max(3, round(1 / fraction))


def split_of(numbers: np.ndarray, stride: int, held_out: Sequence[str]) -> np.ndarray:
    """The split index (0 train, 1 valid, 2 test) of each document number."""
    out = np.zeros(numbers.shape, np.int8)
    if "valid" in held_out:
        out[numbers % stride == stride - 1] = 1
    if "test" in held_out:
        out[numbers % stride == stride - 2] = 2
    return out


def _cuts(sizes: np.ndarray, count: int) -> list[int]:
    """Positions cutting `sizes` (in order) into `count` runs of about equal sum."""
    ends = np.cumsum(sizes, dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    marks = [total * j / count for j in range(1, count)]
    cuts = [int(np.searchsorted(ends, m, side="left")) + 1 for m in marks]
    return [0, *[min(c, sizes.size) for c in cuts], sizes.size]


def _pieces(numbers: np.ndarray, file_starts: np.ndarray) -> tuple[Piece, ...]:
    """The file row ranges spanning document numbers [numbers[0], numbers[-1]]."""
    if numbers.size == 0:
        return ()
    low, high = int(numbers[0]), int(numbers[-1]) + 1
    pieces = []
    for index in range(file_starts.size - 1):
        begin, end = int(file_starts[index]), int(file_starts[index + 1])
        a, b = max(low, begin), min(high, end)
        if a < b:
            pieces.append(Piece(index, a - begin, b - begin, a))
    return tuple(pieces)


def plan_shards(output_name: str, names: Sequence[str], paths: Sequence[str],
                sizes: Sequence[np.ndarray], counts: dict[str, int | None], stride: int,
                shard_size: int | None) -> list[ShardPlan]:
    """The shards of one source, in order: train, then valid, then test.

    `sizes[i]` holds the text bytes of input i's documents; `counts` the number of shards per
    split (`train: None` = one per input file)."""
    held_out = tuple(s for s in ("valid", "test") if counts.get(s))
    file_starts = np.concatenate([[0], np.cumsum([s.size for s in sizes])]).astype(np.int64)
    every = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    numbers = np.arange(every.size, dtype=np.int64)
    split = split_of(numbers, stride, held_out)
    plans: list[ShardPlan] = []
    if counts.get("train") is None:
        for index, name in enumerate(names):
            rows = numbers[file_starts[index]:file_starts[index + 1]]
            plans.append(ShardPlan(f"{output_name}_{name}", "train", paths[index],
                                   _pieces(rows, file_starts), stride, held_out, shard_size))
    for split_index, split_name in enumerate(SPLITS):
        count = counts.get(split_name)
        if not count or (split_name == "train" and counts.get("train") is None):
            continue
        chosen = numbers[split == split_index]
        cuts = _cuts(every[chosen], count)
        for j in range(count):
            rows = chosen[cuts[j]:cuts[j + 1]]
            pieces = _pieces(rows, file_starts)
            source = ", ".join(dict.fromkeys(paths[p.file] for p in pieces)) or "-"
            plans.append(ShardPlan(f"{output_name}_{split_name}_{j:05d}", split_name, source,
                                   pieces, stride, held_out))
    return plans


def plan_key(plan: ShardPlan, identity: dict[str, Any]) -> str:
    """What makes a shard this shard: its plan and what the whole preparation depends on."""
    text = json.dumps({"plan": asdict(plan), **identity}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- records


def record_path(records_dir: str | Path, prefix: str) -> Path:
    return Path(records_dir) / f"{prefix}.json"


def read_record(records_dir: str | Path, prefix: str) -> dict[str, Any] | None:
    try:
        return json.loads(record_path(records_dir, prefix).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def complete(spec: TaskSpec) -> dict[str, Any] | None:
    """The shard's record when it names this plan and every dataset still matches it."""
    found = read_record(spec.records_dir, spec.plan.prefix)
    if not found or found.get("key") != spec.key:
        return None
    for dataset in found.get("datasets", []):
        prefix = str(Path(spec.output_dir) / dataset["prefix"])
        if not all(Path(prefix + s).is_file() for s in (".bin", ".idx")):
            return None
        if dataset_files.recorded_problem(prefix, dataset, "") is not None:
            return None
    return found


def _write_json(path: Path, content: dict[str, Any], work: Path) -> None:
    staged = work / f"{path.name}.{os.getpid()}.part"
    staged.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    os.replace(staged, path)


# ----------------------------------------------------------------------------- the task


def _builder_class() -> Any:
    import logging
    import warnings

    logging.getLogger("megatron").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    return IndexedDatasetBuilder


def _texts(spec: TaskSpec) -> Iterator[tuple[list[Any], str]]:
    """The task's documents in order, in batches, each batch with its input file's name."""
    import datasets

    plan = spec.plan
    for piece in plan.pieces:
        files = spec.arrow_files[piece.file]
        table = datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
        column = table.data.column(spec.column)
        for start in range(piece.start, piece.stop, ENCODE_BATCH):
            stop = min(start + ENCODE_BATCH, piece.stop)
            texts = column.slice(start, stop - start).to_pylist()
            numbers = np.arange(piece.first + start - piece.start, piece.first + stop - piece.start)
            mine = split_of(numbers, plan.stride, plan.held_out) == SPLITS.index(plan.split)
            yield [t for t, keep in zip(texts, mine, strict=True) if keep], str(piece.file)


def _encode(tokenizer: Any, texts: list[Any], eod: int, keep_empty: bool) -> list[list[int]]:
    """Each document's ids plus the EOD; an empty one is []. Kept empty (Megatron-LM's way),
    only missing or zero-length text is empty and whitespace is encoded like any text."""
    if keep_empty:
        chosen = [i for i, t in enumerate(texts) if isinstance(t, str) and t]
    else:
        chosen = [i for i, t in enumerate(texts) if t and not t.isspace()]
    ids: list[list[int]] = [[] for _ in texts]
    for i, encoding in zip(chosen, tokenizer.encode_batch_fast([texts[i] for i in chosen]),
                           strict=True):
        if encoding.ids:
            ids[i] = [*encoding.ids, eod]
    return ids


class _Writer:
    """The task's dataset(s): one, or a new one every `shard_size` documents."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)
        self.done: list[_Dataset] = []
        self.open: _Dataset | None = None

    def _name(self) -> str:
        plan = self.spec.plan
        return f"{plan.prefix}_{len(self.done):05d}" if plan.shard_size else plan.prefix

    def _start(self) -> _Dataset:
        name = self._name()
        part = Path(self.spec.work_dir) / f"{name}.{os.getpid()}"
        builder = _builder_class()(f"{part}.bin", dtype=self.dtype.type)
        self.open = _Dataset(name, builder, part)
        return self.open

    def add(self, tokens: list[int], source: str) -> None:
        if not tokens and not self.spec.keep_empty:  # skipped: counted where it fell
            (self.open or (self.done[-1] if self.done else self._start())).empty += 1
            return
        dataset = self.open or self._start()
        dataset.sources.add(source)
        dataset.empty += 0 if tokens else 1
        array = np.asarray(tokens, dtype=self.dtype)
        dataset.builder.add_document(array, [array.size] if array.size else [])
        dataset.bin_crc32 = zlib.crc32(array.tobytes(), dataset.bin_crc32)
        dataset.documents += 1 if array.size else 0
        dataset.tokens += array.size
        size = self.spec.plan.shard_size
        if size and dataset.documents == size:
            self._finish()

    def _finish(self) -> None:
        dataset = self.open
        dataset.builder.finalize(f"{dataset.part}.idx")
        final = Path(self.spec.output_dir) / dataset.prefix
        Path(f"{final}.idx").unlink(missing_ok=True)  # never pair an old .idx with a new .bin
        for suffix in (".bin", ".idx"):
            os.replace(f"{dataset.part}{suffix}", f"{final}{suffix}")
        self.done.append(dataset)
        self.open = None

    def close(self) -> list[_Dataset]:
        if self.open is not None:
            self._finish()
        elif not self.done:  # nothing at all: an empty dataset, as Megatron writes one
            self._start()
            self._finish()
        return self.done


def run_task(spec: TaskSpec) -> dict[str, Any]:
    """Write one shard's dataset(s), publish them, then its record; returns the record."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the workers are the parallelism
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(spec.tokenizer_json)
    writer = _Writer(spec)
    for texts, source in _texts(spec):
        for ids in _encode(tokenizer, texts, spec.eod_id, spec.keep_empty):
            writer.add(ids, source)
    datasets_written = writer.close()
    record = {"key": spec.key, "prefix": spec.plan.prefix, "split": spec.plan.split,
              "source": spec.plan.source, "datasets": []}
    for dataset in datasets_written:
        prefix = str(Path(spec.output_dir) / dataset.prefix)
        record["datasets"].append({
            "prefix": dataset.prefix, "documents": dataset.documents, "empty": dataset.empty,
            "tokens": dataset.tokens, "bin_crc32": dataset.bin_crc32,
            **dataset_files.record(prefix)})
    _write_json(record_path(spec.records_dir, spec.plan.prefix), record, Path(spec.work_dir))
    return record

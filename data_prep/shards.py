"""A preparation cut into shards, each written by one task, each task redone only if incomplete.

Why it is built this way:
- The plan is made from what the driver learns in O(files) (each input's size, a Parquet
  file's row count), before any reading or tokenizing, so it is the same whatever runs the
  tasks and however many workers there are: `num_shards=N` cuts the inputs, taken end to end
  in order, into N byte ranges of about equal size (so about equal tokens); a shard reads its
  own range (`data_prep/readers.py`: a line belongs to the range holding its first byte, a
  compressed file is one range). Without `num_shards` a shard is one input file (and
  `shard_size` still starts a new dataset every N documents).
- Held-out documents (`valid_shards`, `test_shards`) are chosen by their text alone (its
  CRC-32 modulo `1/held_out_fraction`), so the choice does not depend on the layout and a
  duplicated document never sits on both sides; the i-th held-out shard reads the ranges of
  the i-th group of train shards and keeps only its split's documents.
- A task (`run_task`) is a plain picklable value and a module-level function: the local process
  pool and Ray run exactly the same code, and everything that grows with the corpus (reading,
  parsing, tokenizing, writing) happens there; the driver only plans and collects records.
- Each task writes its datasets in the hidden work folder, publishes them by rename, then writes
  its record (`<output>.shards/<prefix>.json`: the plan's key, sizes, the `.idx` CRC-32 and the
  `.bin` CRC-32 computed while writing) by rename too. A shard is complete when its record
  names this plan and its files still match the record (sizes, index CRC-32, the `.bin`'s full
  CRC-32, so a block damaged in place is redone, not kept): a killed run (driver or worker)
  leaves at worst a stale work file, a task that fails (a full disk) removes its own, and the
  same command redoes only the shards that are not complete.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep import readers
from data_prep.readers import InputFile
from plugins.protocol.errors import ConfigError
from recipes.config import dataset_files

ENCODE_BATCH = readers.BATCH  # documents per encode_batch call
SPLITS = ("train", "valid", "test")
Report = Callable[[str, float], None]  # (shard prefix, share of it done)


@dataclass(frozen=True)
class Piece:
    """Units [start, stop) of one input (bytes of plain lines, rows of Parquet, 0..1 for an
    input read as one stream)."""

    file: int
    start: int
    stop: int


@dataclass(frozen=True)
class ShardPlan:
    """One task: the input ranges it reads, which split it keeps, the dataset names."""

    prefix: str  # the (first) dataset's name, relative to the output's folder
    split: str
    source: str  # the input file(s) it reads, for the summary
    pieces: tuple[Piece, ...]
    stride: int  # held-out selection: a document is valid if crc32(text) % stride is
    held_out: tuple[str, ...]  # stride - 1, test if stride - 2 (for the splits listed)
    shard_size: int | None = None  # documents per dataset inside the task (files layout only)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a worker needs, by value (picklable for a process pool and for Ray)."""

    plan: ShardPlan
    key: str  # the plan's identity: a record with another key is not this shard
    inputs: tuple[InputFile, ...]
    tokenizer_json: str
    eod_id: int
    dtype: str
    keep_empty: bool
    output: str  # the preparation's prefix (named in errors)
    output_dir: str
    work_dir: str
    records_dir: str

    @property
    def weight(self) -> float:
        """The bytes of input the task reads (what the job's progress counts)."""
        return sum(piece_weight(self.inputs[p.file], p) for p in self.plan.pieces)


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


# ----------------------------------------------------------------------------- planning


def held_out_stride(fraction: float) -> int:
    """Every stride-th document is held out for each held-out split (1% -> every 100th)."""
    return max(3, round(1 / fraction))


def split_of(text: str, stride: int, held_out: Sequence[str]) -> int:
    """The split index (0 train, 1 valid, 2 test) of a document, from its text alone."""
    if not held_out or not text:
        return 0
    residue = zlib.crc32(text.encode("utf-8")) % stride
    if residue == stride - 1 and "valid" in held_out:
        return 1
    if residue == stride - 2 and "test" in held_out:
        return 2
    return 0


def piece_weight(source: InputFile, piece: Piece) -> float:
    return (piece.stop - piece.start) * source.size / max(source.units, 1)


def _range_pieces(inputs: Sequence[InputFile], starts: Sequence[int], low: int,
                  high: int) -> tuple[Piece, ...]:
    """The pieces of global bytes [low, high) (inputs end to end): a splittable input gives
    the units under that span, one read as a stream belongs wholly to the range where it
    starts."""
    pieces = []
    for index, (source, begin) in enumerate(zip(inputs, starts, strict=True)):
        end = begin + source.size
        if not source.splittable:
            if low <= begin < high:
                pieces.append(Piece(index, 0, source.units))
            continue
        a, b = max(low, begin) - begin, min(high, end) - begin
        if a < b:
            unit_a, unit_b = a * source.units // source.size, b * source.units // source.size
            if unit_a < unit_b:
                pieces.append(Piece(index, unit_a, unit_b))
    return tuple(pieces)


def _source(inputs: Sequence[InputFile], pieces: Sequence[Piece]) -> str:
    return ", ".join(dict.fromkeys(inputs[p.file].path for p in pieces)) or "-"


def cut(total: int, count: int, j: int) -> tuple[int, int]:
    """Global bytes [low, high) of the j-th of `count` train ranges over `total` bytes."""
    return total * j // count, total * (j + 1) // count


def planned_prefixes(output_name: str, names: Sequence[str],
                     counts: dict[str, int | None]) -> list[tuple[str, str]]:
    """(prefix, split) of every shard, in plan order: the one place shards are named, so the
    check for paths in the way (`data_prep/prepare.py`) names what `plan_shards` writes."""
    if counts.get("train") is None:
        named = [(f"{output_name}_{name}", "train") for name in names]
    else:
        named = [(f"{output_name}_train_{j:05d}", "train") for j in range(int(counts["train"]))]
    for split in ("valid", "test"):
        named += [(f"{output_name}_{split}_{j:05d}", split) for j in range(counts.get(split) or 0)]
    return named


def dataset_name(prefix: str, shard_size: int | None, index: int) -> str:
    """The index-th dataset of a shard: the shard's prefix, or one per `shard_size` documents."""
    return f"{prefix}_{index:05d}" if shard_size else prefix


def plan_shards(output_name: str, names: Sequence[str], inputs: Sequence[InputFile],
                counts: dict[str, int | None], stride: int,
                shard_size: int | None) -> list[ShardPlan]:
    """The shards of one source, in order: train, then valid, then test. `counts`: shards per
    split (`train: None` = one per input file)."""
    held_out = tuple(s for s in ("valid", "test") if counts.get(s))
    starts = [0]
    for source in inputs:
        starts.append(starts[-1] + source.size)
    total = starts[-1]
    prefixes = planned_prefixes(output_name, names, counts)
    if counts.get("train") is None:
        ranges = [(Piece(i, 0, s.units),) for i, s in enumerate(inputs)]
        plans = [ShardPlan(prefixes[i][0], "train", inputs[i].path, ranges[i], stride,
                           held_out, shard_size) for i in range(len(inputs))]
    else:
        count = int(counts["train"])
        ranges = [_range_pieces(inputs, starts[:-1], *cut(total, count, j))
                  for j in range(count)]
        plans = [ShardPlan(prefixes[j][0], "train", _source(inputs, pieces),
                           pieces, stride, held_out) for j, pieces in enumerate(ranges)]
    held = iter(prefixes[len(plans):])
    for split_name in held_out:
        count = int(counts[split_name])
        for j in range(count):
            group = ranges[j * len(ranges) // count:(j + 1) * len(ranges) // count]
            pieces = tuple(p for r in group for p in r)
            plans.append(ShardPlan(next(held)[0], split_name,
                                   _source(inputs, pieces), pieces, stride, held_out))
    return plans


def _train_shards_with_input(inputs: Sequence[InputFile], count: int) -> int:
    """How many of `count` train shards cut over the inputs get any input to read."""
    starts = [0]
    for source in inputs:
        starts.append(starts[-1] + source.size)
    total = starts[-1]
    return sum(bool(_range_pieces(inputs, starts[:-1], *cut(total, count, j)))
               for j in range(count))


def _most_train_shards(inputs: Sequence[InputFile], count: int, tries: int = 64) -> int:
    """The largest shard count at most `count` that gives every train shard input (bounded
    search; 1 always does)."""
    for candidate in _candidates(count, tries):
        if _train_shards_with_input(inputs, candidate) == candidate:
            return candidate
    return 1


def _candidates(top: int, tries: int = 64) -> Iterator[int]:
    """Shard counts to try, largest first: `tries` consecutive ones below `top`, then halving
    down to 1 (a bounded search; each try is one plan, O(shards + files))."""
    count = top
    for count in range(top, max(top - tries, 0), -1):
        yield count
    while count > 1:
        count //= 2
        yield count


def has_text(text: Any, keep_empty: bool) -> bool:
    """A document that gets tokens (`_encode`'s rule): kept empty, whitespace is text too."""
    return isinstance(text, str) and bool(text) and (keep_empty or not text.isspace())


def text_positions(inputs: Sequence[InputFile], stride: int, held_out: Sequence[str],
                   keep_empty: bool) -> list[tuple[list[int], ...]]:
    """Per input, per split (train, valid, test), the sorted units (bytes, rows; 0 for a file
    read whole) where a document with text starts. It reads every input, so the driver calls it
    only on a small corpus (each file no larger than the head it has read already), to refuse a
    plan with a shard that would hold no tokens before anything is tokenized or written."""
    found = []
    for source in inputs:
        units: tuple[list[int], ...] = ([], [], [])
        for unit, text in readers.positioned_documents(source):
            if has_text(text, keep_empty):
                units[split_of(text, stride, held_out)].append(unit)
        found.append(units)
    return found


def plan_has_text(plan: ShardPlan, positions: Sequence[tuple[list[int], ...]]) -> bool:
    """Some piece of the plan holds the start of a document with text of the plan's split."""
    mine = SPLITS.index(plan.split)
    for piece in plan.pieces:
        units = positions[piece.file][mine]
        at = bisect.bisect_left(units, piece.start)
        if at < len(units) and units[at] < piece.stop:
            return True
    return False


def _count_with_text(replan: Callable[[dict[str, int | None]], list[ShardPlan]],
                     counts: dict[str, int | None], split: str, top: int,
                     positions: Sequence[tuple[list[int], ...]]) -> int | None:
    """The largest count of `split`'s shards up to `top` whose plan gives every one of them a
    document with text (certified by planning it), or None when not even one shard does."""
    for count in _candidates(top):
        plans = replan({**counts, split: count})
        if all(plan_has_text(p, positions) for p in plans if p.split == split):
            return count
    return None


def empty_text_problem(replan: Callable[[dict[str, int | None]], list[ShardPlan]],
                       counts: dict[str, int | None], held_out_fraction: float,
                       positions: Sequence[tuple[list[int], ...]]) -> str | None:
    """A planned shard where no document with text starts, found before tokenizing (from
    `text_positions`): its `.bin` would be empty, which Megatron cannot map. The count offered
    instead is planned and checked the same way, so following the advice succeeds."""
    plans = replan(counts)
    empty = [p for p in plans if not plan_has_text(p, positions)]
    if not empty:
        return None
    split, first = empty[0].split, empty[0].prefix
    texts = sum(len(units[SPLITS.index(split)]) for units in positions)
    shards = [p for p in plans if p.split == split]
    held = f"{first} would hold no tokens ({len(empty)} of {len(shards)} {split} shards)"
    if split == "train" and counts.get("train") is None:
        return (f"{held}: input file {empty[0].source} has no document with text; remove it "
                "from input=")
    key = "num_shards" if split == "train" else f"{split}_shards"
    best = _count_with_text(replan, counts, split, min(len(shards) - 1, texts), positions)
    if best is None and split == "train":
        return f"{held}: no document of the source has text; give inputs with text"
    if best is None:
        documents = sum(len(u) for units in positions for u in units)
        return (f"{first} would hold no tokens: held_out_fraction={held_out_fraction} holds out "
                f"about 1 in {held_out_stride(held_out_fraction)} of the source's {documents:,} "
                f"documents and none fell in {split}; raise held_out_fraction or prepare more "
                "documents")
    return (f"{held}: {key}={counts.get(split)} cuts the source's {texts:,} {split} documents "
            f"with text into ranges where none starts in some; give {key}={best}")


def contained_count(total: int, count: int, full: Sequence[bool]) -> int:
    """A train shard count sure to give every shard a document with text, from a run of `count`
    shards where `full[j]` says range j had one: each range of the count returned wholly holds
    a full range of that run (1 when one range was full)."""
    spans = [cut(total, count, j) for j in range(count) if full[j]]
    starts = [a for a, _ in spans]

    def holds_one(low: int, high: int) -> bool:  # the first full range starting in it fits
        at = bisect.bisect_left(starts, low)
        return at < len(spans) and spans[at][1] <= high

    for candidate in _candidates(count - 1):
        if all(holds_one(*cut(total, candidate, j)) for j in range(candidate)):
            return candidate
    return 1


def empty_plan_problem(plans: Sequence[ShardPlan], inputs: Sequence[InputFile],
                       counts: dict[str, int | None]) -> str | None:
    """Shards the plan gives no input at all, found from the sizes before anything is written:
    a compressed file (or one read whole) lies wholly in one shard, and a held-out shard
    reads the ranges of a group of train shards. An empty shard's `.bin` is empty, which no
    reader can map (`ValueError: cannot mmap an empty file` in training)."""
    for split in SPLITS:
        shards = [p for p in plans if p.split == split]
        empty = [p for p in shards if not p.pieces]
        if not empty:
            continue
        whole = sum(not s.splittable for s in inputs)
        if split == "train" and counts.get("train") is not None:
            most = _most_train_shards(inputs, int(counts["train"]))
            return (f"num_shards={counts['train']} would leave {len(empty)} of {len(shards)} "
                    f"train shards with no input ({empty[0].prefix} first): the {len(inputs)} "
                    f"input file(s) include {whole} that cannot be cut (compressed, or read "
                    f"whole), each of which lies wholly in one shard; give num_shards={most}"
                    f"{' or fewer' if most > 1 else ''}, or the corpus as more files")
        key = f"{split}_shards"
        groups = len([p for p in plans if p.split == "train"])
        return (f"{key}={counts.get(split)} would leave {len(empty)} of {len(shards)} {split} "
                f"shards with no input ({empty[0].prefix} first): each reads the ranges of a "
                f"group of the {groups} train shard(s); give {key}={groups} or fewer")
    return None


def empty_shard_problem(records: Sequence[dict[str, Any]], counts: dict[str, int | None],
                        held_out_fraction: float, total_bytes: int) -> str | None:
    """A written shard that holds no tokens (no document with text started in its ranges, or
    none of its documents fell in its held-out split): refused before the manifest and
    Megatron-LM's blend files are written, so nothing names it."""
    datasets = [(r, d) for r in records for d in r["datasets"]]
    empty = [(r, d) for r, d in datasets if d["tokens"] == 0]
    if not empty:
        return None
    record, dataset = empty[0]
    split = record["split"]
    documents = sum(d["documents"] for _, d in datasets)
    train_documents = sum(d["documents"] for r, d in datasets if r["split"] == "train")
    empties = f", only {dataset['empty']} empty document(s)" if dataset["empty"] else ""
    held = f"{dataset['prefix']} would hold no tokens{empties}"
    if split != "train":
        key = f"{split}_shards"
        return (f"{held}: held_out_fraction={held_out_fraction} holds out about 1 in "
                f"{held_out_stride(held_out_fraction)} of the source's {documents:,} documents "
                f"and none fell in this shard; raise held_out_fraction, lower {key}="
                f"{counts.get(split)} or prepare more documents; no manifest was written")
    if counts.get("train") is not None:
        full = [any(d["tokens"] for d in r["datasets"]) for r in records
                if r["split"] == "train"]
        return (f"{held}: num_shards={counts['train']} cuts the source's {train_documents:,} "
                f"train documents into ranges where none with text starts; give num_shards="
                f"{contained_count(total_bytes, len(full), full)}; no manifest was written")
    return (f"{held}: input file {record['source']} has no document with text; remove it from "
            "input=; no manifest was written")


def plan_key(plan: ShardPlan, identity: dict[str, Any]) -> str:
    """What makes a shard this shard: its plan and what the whole preparation depends on."""
    text = json.dumps({"plan": asdict(plan), **identity}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- records


def record_path(records_dir: str | Path, prefix: str) -> Path:
    return Path(records_dir) / f"{prefix}.json"


def read_record(records_dir: str | Path, prefix: str) -> dict[str, Any] | None:
    """A shard's record; None when missing, unreadable or damaged (the shard is redone)."""
    try:
        found = json.loads(record_path(records_dir, prefix).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if record_shape_ok(found) else None


RECORD_TEXTS = ("key", "prefix", "split", "source")  # a record's fields the driver reads
DATASET_NUMBERS = ("documents", "empty", "tokens", *dataset_files.RECORD_KEYS)


def record_shape_ok(found: Any) -> bool:
    """A record is an object with its texts and a `datasets` list of objects naming a prefix
    with their counts; anything else (a JSON string, null, [] written over it, a field lost)
    is damage: the shard is redone, never a traceback."""
    if not isinstance(found, dict) or not all(isinstance(found.get(k), str)
                                              for k in RECORD_TEXTS):
        return False
    datasets = found.get("datasets")
    return isinstance(datasets, list) and all(
        isinstance(d, dict) and isinstance(d.get("prefix"), str)
        and all(isinstance(d.get(k), int) for k in DATASET_NUMBERS) for d in datasets)


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
        if not tokens_match(prefix, dataset):
            return None
    return found


def tokens_match(prefix: str, dataset: dict[str, Any]) -> bool:
    """The `.bin` is still the tokens the task wrote: its full CRC-32 against the one the
    record took while writing. The sizes and the CRC of its first and last 64 KiB miss damage
    in the middle (a block overwritten in place), which a re-run would otherwise keep and a
    run train on. Reading the whole `.bin` costs about 0.06 s per 100 MB from the page cache
    (2 CPU cores; a disk's read speed when cold), small beside tokenizing it."""
    if not isinstance(dataset.get("bin_crc32"), int):
        return True  # records written before the CRC was kept: sizes and sample only
    try:
        return dataset_files.crc32(dataset_files.bin_path(prefix)) == dataset["bin_crc32"]
    except OSError:
        return False


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


def _texts(spec: TaskSpec, report: Report | None) -> Iterator[list[Any]]:
    """The task's documents in order, in batches (only its split's, when held out)."""
    plan = spec.plan
    mine = SPLITS.index(plan.split)
    weights = [piece_weight(spec.inputs[p.file], p) for p in plan.pieces]
    total, done = max(sum(weights), 1.0), 0.0
    for piece, weight in zip(plan.pieces, weights, strict=True):
        def progress(share: float, before: float = done, weight: float = weight) -> None:
            if report:
                report(plan.prefix, (before + share * weight) / total)

        batch: list[Any] = []
        for text in readers.documents(spec.inputs[piece.file], piece.start, piece.stop,
                                      progress):
            if not plan.held_out or split_of(text, plan.stride, plan.held_out) == mine:
                batch.append(text)
                if len(batch) == ENCODE_BATCH:
                    yield batch
                    batch = []
        if batch:
            yield batch
        done += weight


def _encode(tokenizer: Any, texts: list[Any], eod: int, keep_empty: bool) -> list[list[int]]:
    """Each document's ids plus the EOD; an empty one is []. Kept empty (Megatron-LM's way),
    only missing or zero-length text is empty and whitespace is encoded like any text."""
    chosen = [i for i, t in enumerate(texts) if has_text(t, keep_empty)]
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
        return dataset_name(plan.prefix, plan.shard_size, len(self.done))

    def _start(self) -> _Dataset:
        name = self._name()
        part = Path(self.spec.work_dir) / f"{name}.{os.getpid()}"
        builder = _builder_class()(f"{part}.bin", dtype=self.dtype.type)
        self.open = _Dataset(name, builder, part)
        return self.open

    def add(self, tokens: list[int]) -> None:
        if not tokens and not self.spec.keep_empty:  # skipped: counted where it fell
            (self.open or (self.done[-1] if self.done else self._start())).empty += 1
            return
        dataset = self.open or self._start()
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


    def discard(self) -> None:
        """Remove the work files of the dataset being written (a failed task)."""
        if self.open is not None:
            try:  # Megatron's builder holds the .bin open (its buffer would be flushed later)
                self.open.builder.data_file.close()
            except OSError:
                pass
            for suffix in (".bin", ".idx"):
                Path(f"{self.open.part}{suffix}").unlink(missing_ok=True)
            self.open = None


def free_space(folder: str | Path) -> str:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return "unknown"
    return f"{stat.f_bavail * stat.f_frsize / 2**20:,.1f} MiB"


def disk_full(output: str, err: OSError, writing: str | None = None) -> ConfigError:
    """The one line for a file system that filled up while this preparation wrote to it."""
    folder = Path(output).expanduser().parent
    writing = writing or err.filename
    written = f" writing {writing}" if writing else ""
    return ConfigError(
        f"output={output}: the file system is full ({err.strerror or 'No space left on device'})"
        f"{written}; {free_space(folder)} free in {folder}; the unfinished shard was removed "
        "and the complete ones are kept: free space there (or choose another output) and run "
        "the same command again to finish")


def run_task(spec: TaskSpec, report: Report | None = None) -> dict[str, Any]:
    """Write one shard's dataset(s), publish them, then its record; returns the record.
    A full disk removes the shard's work files and raises one line (`disk_full`)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the workers are the parallelism
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(spec.tokenizer_json)
    writer = _Writer(spec)
    try:
        for texts in _texts(spec, report):
            for ids in _encode(tokenizer, texts, spec.eod_id, spec.keep_empty):
                writer.add(ids)
        return _publish(spec, writer.close())
    except OSError as err:
        writing = writer.open.prefix if writer.open else spec.plan.prefix
        writer.discard()
        if err.errno == errno.ENOSPC:
            raise disk_full(spec.output, err, writing) from None
        raise
    except BaseException:
        writer.discard()
        raise


def _publish(spec: TaskSpec, datasets_written: list[_Dataset]) -> dict[str, Any]:
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

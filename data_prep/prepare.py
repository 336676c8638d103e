"""Local text, JSONL and Parquet -> Megatron Core indexed datasets (`.bin`/`.idx`): one per
input file, or `num_shards` (+ `valid_shards`, `test_shards`) of about equal tokens, plus a
manifest (`<output>.json`) a blend can name, the tokenizer folder and Megatron-LM's blend files.

Why it is built this way:
- The driver does O(files) work: it checks each input's head (`data_prep/readers.py`), plans
  the shards from the files' sizes (`data_prep/shards.py`) and collects the records; every
  shard task reads its own range of the inputs as a stream (JSONL, text, Parquet, compressed),
  tokenizes and writes it, so the work that grows with the corpus runs on the workers and
  memory per worker is bounded by a batch, not by the corpus.
- The tasks run on a local process pool or Ray (`data_prep/executors.py`): the same shards and
  bytes whatever the executor and the number of workers. Each shard is published by rename
  with a record holding its checksums, so a killed run is finished by the same command, which
  redoes only the shards that are not complete; no half-written file is ever named like a
  dataset.
- Datasets are written only through Megatron Core's `IndexedDatasetBuilder`, as Megatron-LM's
  `tools/preprocess_data.py` writes them (one sequence per document, the EOD appended, an empty
  document a zero-length document), so for the same input and tokenizer both `.bin` and `.idx`
  are the same bytes (`empty_documents=skip` leaves them out of the index instead).
- A shard with no tokens has an empty `.bin`, which no reader can map (training dies with
  `cannot mmap an empty file`): a plan that gives a shard no input is refused before anything
  is written, and so, on a small corpus (read whole by the head look already), is one where no
  document with text starts (a tiny held-out share, more shards than lines). On a larger corpus
  such a shard is found once written, before the manifest and Megatron-LM's blend files name it;
  the refused run's datasets are then removed (the same command would be refused again, so
  there is nothing to resume). Each refusal offers a count it has checked to work.
- A path in the way of a name the run writes (a folder named like the manifest, a file named
  like the records folder) is refused before any work, from the code that names them.
- Everything that can be a user mistake (paths, fields, an unreadable file or tokenizer) is
  checked before the first dataset is written, as one-line `ConfigError`s, as far as a bounded
  look at each file's head can tell; a bad line further in stops the job with the same kind
  of line, as does a file system that fills up (the complete shards are kept for the re-run).
- Same inputs, same outputs, byte for byte: input order is sorted, nothing is shuffled, the BPE
  trainer is deterministic (see `data_prep/hf_tokenizer.py`), and the manifest holds no times or
  absolute paths of its own (Megatron-LM's blend files beside it do hold absolute prefixes).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from data_prep import readers
from data_prep.config import (
    COMPRESSIONS,
    FOLDER_OUTPUTS,
    OUTPUTS,
    PrepareConfig,
    input_format,
    output_path,
    shard_names,
    validate,
    work_path,
)
from data_prep.executors import run_tasks
from data_prep.hf_tokenizer import PreparedTokenizer, prepare_tokenizer
from data_prep.readers import InputFile
from data_prep.shards import (
    SPLITS,
    ShardPlan,
    TaskSpec,
    complete,
    dataset_name,
    disk_full,
    empty_plan_problem,
    empty_shard_problem,
    empty_text_problem,
    held_out_stride,
    plan_key,
    plan_shards,
    planned_prefixes,
    read_record,
    record_path,
    text_positions,
)
from plugins.protocol.errors import ConfigError
from recipes.config.dataset_files import RECORD_KEYS
from recipes.config.links import resolved

MAP_BATCH = 1000  # documents per batch the BPE trainer reads


@dataclass(frozen=True)
class Shard:
    """One written dataset; `prefix` is relative to the manifest's folder."""

    prefix: str
    source: str
    documents: int  # documents with tokens
    empty: int  # empty documents (zero-length documents, or left out with empty_documents=skip)
    tokens: int
    split: str = "train"
    files: dict = field(default_factory=dict)  # what identifies its files (dataset_files.record)


@dataclass(frozen=True)
class PrepareResult:
    """What a preparation wrote and how fast."""

    shards: tuple[Shard, ...]
    output: Path  # the prefix: datasets are <output>_<name>.bin/.idx
    manifest: Path  # <output>.json
    tokenizer_dir: Path  # <output>.tokenizer/ (a Hugging Face tokenizer folder)
    tokenizer: PreparedTokenizer
    dtype: str  # uint16 or int32
    seconds: float  # the whole preparation, tokenizer training included
    train_seconds: float  # training the tokenizer (0 when loaded)
    data_args: Path  # <output>.data-args: Megatron-LM's --data-args-path file (train)
    per_split_args: Path  # <output>.per-split-data-args.json: its --per-split-data-args-path
    pack_size: int | None = None  # rows of the packing indexes written (pack_size=)
    packs: tuple = ()  # PackingStats of each shard's packing index
    pad_multiple: int = 1  # documents padded to multiples of this in those indexes
    redone: int = 0  # shards written by this run (the others were complete already)
    workers: int = 1  # workers that ran them at once
    empty_kept: bool = True  # empty documents are zero-length documents in the index
    tasks: int = 0  # shard tasks of the plan (a task writes one dataset, or several)
    earlier: tuple[str, ...] = ()  # datasets of this prefix an earlier run left, not listed

    @property
    def tokenizer_file(self) -> Path:
        return self.tokenizer_dir / "tokenizer.json"

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def empty(self) -> int:
        return sum(s.empty for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


# ----------------------------------------------------------------------------- reading


def read_input(path: Path, cfg: PrepareConfig) -> InputFile:
    """One input as the tasks will read it, after the bounded look at its head."""
    fmt = input_format(path)
    assert fmt is not None  # resolve_inputs refused unknown formats
    suffix = path.suffix.lower()
    compression = suffix if suffix in COMPRESSIONS else None
    return readers.inspect(path, fmt, compression, cfg.text_field, cfg.sample_by)


def _texts(inputs: Sequence[InputFile]) -> Iterator[list[str]]:
    """Every non-empty document, in batches, in input order (what train:VOCAB learns from)."""
    for source in inputs:
        batch: list[str] = []
        for text in readers.documents(source):
            if text and not text.isspace():
                batch.append(text)
            if len(batch) == MAP_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


# ----------------------------------------------------------------------------- writing


@functools.cache
def _indexed_dataset_api() -> tuple[Any, Any]:
    """Megatron Core's builder and dtype rule, imported quietly (its import warns about TE,
    Apex and CUDA, none of which writing a dataset needs)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    logging.getLogger("megatron").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    return IndexedDatasetBuilder, DType


def dataset_dtype(vocab_size: int) -> type[np.number]:
    """uint16 when every id fits (Megatron's own rule: fewer than 65500 ids), else int32."""
    return _indexed_dataset_api()[1].optimal_dtype(vocab_size)


def shard_counts(cfg: PrepareConfig) -> dict[str, int | None]:
    return {"train": cfg.num_shards, "valid": cfg.valid_shards, "test": cfg.test_shards}


def _identity(cfg: PrepareConfig, inputs: Sequence[InputFile], prepared: PreparedTokenizer,
              dtype: type[np.number], tokenizer_json: str) -> dict[str, Any]:
    """What every shard depends on besides its own plan (a change redoes every shard)."""
    files = [(s.path, s.size, Path(s.path).stat().st_mtime_ns) for s in inputs]
    return {"inputs": files, "column": [s.column for s in inputs],
            "tokenizer": hashlib.sha256(tokenizer_json.encode()).hexdigest(),
            "eod_id": prepared.eod_id, "dtype": np.dtype(dtype).name,
            "empty_documents": cfg.empty_documents, "sample_by": cfg.sample_by}


SMALL_CORPUS = 64 * 2**20  # bytes of input the driver may read once more to place documents


def small_corpus(inputs: Sequence[InputFile]) -> bool:
    """Every input is no larger than the head the pre-flight has read of it already, and all
    of them together are small, so reading them once more to place each document with text
    costs about what that look did (a large corpus is read only by the shard tasks)."""
    return (all(source.size <= readers.HEAD_BYTES for source in inputs)
            and sum(source.size for source in inputs) <= SMALL_CORPUS)


def planned(cfg: PrepareConfig, inputs: Sequence[InputFile],
            names: Sequence[str]) -> list[ShardPlan]:
    """The plan, refused before any tokenizing or writing when a shard would get no input, or
    (on a small corpus, where it is cheap to tell) no document with text."""
    output = Path(cfg.output).expanduser()
    stride = held_out_stride(cfg.held_out_fraction)

    def replan(counts: dict[str, int | None]) -> list[ShardPlan]:
        return plan_shards(output.name, names, inputs, counts, stride, cfg.shard_size)

    plans = replan(shard_counts(cfg))
    problem = empty_plan_problem(plans, inputs, shard_counts(cfg))
    if not problem and small_corpus(inputs):
        held_out = plans[0].held_out if plans else ()
        positions = text_positions(inputs, stride, held_out, cfg.empty_documents == "keep")
        problem = empty_text_problem(replan, shard_counts(cfg), cfg.held_out_fraction,
                                     positions)
    if problem:
        raise ConfigError(f"output={cfg.output}: {problem}")
    return plans


def task_specs(cfg: PrepareConfig, inputs: Sequence[InputFile], plans: Sequence[ShardPlan],
               prepared: PreparedTokenizer, dtype: type[np.number], output: Path,
               work: Path) -> list[TaskSpec]:
    """The preparation's shards as task values, in manifest order."""
    tokenizer_json = prepared.tokenizer.to_str()
    identity = _identity(cfg, inputs, prepared, dtype, tokenizer_json)
    records = records_folder(output)
    records.mkdir(exist_ok=True)
    return [TaskSpec(plan=plan, key=plan_key(plan, identity), inputs=tuple(inputs),
                     tokenizer_json=tokenizer_json, eod_id=prepared.eod_id,
                     dtype=np.dtype(dtype).name, keep_empty=cfg.empty_documents == "keep",
                     output=cfg.output, output_dir=str(output.parent), work_dir=str(work),
                     records_dir=str(records))
            for plan in plans]


def records_folder(output: Path) -> Path:
    return output_path(output, "records")


MIB = 2**20


def write_all(specs: Sequence[TaskSpec], cfg: PrepareConfig, bar: Progress) -> tuple[
        list[dict[str, Any]], int]:
    """Run the shards that are not complete; return every shard's record (plan order) and
    how many were redone. The bar: the whole job in MiB of input read (its ETA), and one bar
    per shard being written."""
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for spec in specs:
        found = complete(spec)
        if found is None:
            todo.append(spec)
        else:
            records[spec.plan.prefix] = found
    weights = {spec.plan.prefix: spec.weight / MIB for spec in specs}
    shares: dict[str, float] = {p: 1.0 for p in records}
    job = bar.add_task("job", total=sum(weights.values()) or 1,
                       completed=sum(weights[p] for p in records),
                       info=_job_info(records, len(specs)))
    rows: dict[str, Any] = {}

    def progress(prefix: str, share: float) -> None:
        if prefix in records:
            return
        shares[prefix] = share
        if prefix not in rows:
            rows[prefix] = bar.add_task(f"  {prefix}", total=weights[prefix] or 1, info="")
        bar.update(rows[prefix], completed=share * weights[prefix])
        bar.update(job, completed=sum(weights[p] * s for p, s in shares.items()), refresh=True)

    def done(record: dict[str, Any]) -> None:
        prefix = record["prefix"]
        records[prefix] = record
        shares[prefix] = 1.0
        if prefix in rows:
            bar.remove_task(rows.pop(prefix))
        bar.update(job, completed=sum(weights[p] * s for p, s in shares.items()),
                   info=_job_info(records, len(specs)), refresh=True)

    with bar:
        try:
            run_tasks(todo, cfg.executor, cfg.num_proc, cfg.ray_address, done,
                      None if bar.disable else progress)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            raise disk_full(cfg.output, err) from None
    return [records[spec.plan.prefix] for spec in specs], len(todo)


def _job_info(records: dict[str, dict[str, Any]], shards: int) -> str:
    return f"{len(records)}/{shards} shards, {_tokens(records.values()):,} tokens"


def _tokens(records: Any) -> int:
    return sum(d["tokens"] for r in records for d in r["datasets"])


def shards_of(records: Sequence[dict[str, Any]]) -> list[Shard]:
    return [Shard(d["prefix"], r["source"], d["documents"], d["empty"], d["tokens"],
                  r["split"], {k: d[k] for k in RECORD_KEYS})
            for r in records for d in r["datasets"]]


# ----------------------------------------------------------------------------- the run


def _progress(enabled: bool | None, console: Console) -> Progress:
    """The job's bar (MiB of input read, shards and tokens done, its ETA) over one bar per
    shard being written; off when the output is not a terminal (logs, tests, pipes)."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(),
        TextColumn("{task.completed:,.1f}/{task.total:,.1f} MiB"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, auto_refresh=False,
        disable=not (console.is_terminal if enabled is None else enabled),
    )


def _work_folder(output: Path) -> Path:
    """A hidden folder beside the output (same filesystem, so publishing is a rename)."""
    folder = work_path(output)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"output={output}: cannot write {err.filename or folder} ({err.strerror}); "
            "remove what is in the way or choose another output"
        ) from None
    return folder


def written_paths(cfg: PrepareConfig, files: Sequence[Path]) -> list[tuple[Path, bool]]:
    """(path, is a folder) of everything the run writes under a name known before it starts,
    named by the code that writes them: the work folder, the manifest, tokenizer folder,
    records and Megatron-LM's files, each shard's datasets, record and packing index."""
    from data_prep.packing import pack_index_paths

    output = Path(cfg.output).expanduser()
    records = records_folder(output)
    paths = [(work_path(output), True)]
    paths += [(output_path(output, role), role in FOLDER_OUTPUTS) for role in OUTPUTS]
    for prefix, _ in planned_prefixes(output.name, shard_names(files), shard_counts(cfg)):
        paths.append((record_path(records, prefix), False))
        for dataset in (dataset_name(prefix, cfg.shard_size, 0),):  # later ones: below
            base = output.parent / dataset
            paths += [(Path(f"{base}.bin"), False), (Path(f"{base}.idx"), False)]
            if cfg.pack_size:
                paths += [(p, False) for p in pack_index_paths(base, cfg.pack_size,
                                                                cfg.pad_multiple)]
    return paths


def sub_dataset_of(name: str, prefixes: set[str]) -> bool:
    """`name` is a later dataset of a shard cut every `shard_size` documents (its prefix and
    an index, as `dataset_name` writes them)."""
    stem, _, index = name.rpartition("_")
    return (stem in prefixes and index.isdigit()
            and dataset_name(stem, 1, int(index)) == name)


def in_the_way(path: Path, folder: bool) -> str | None:
    """What already holds the name of a file (or folder) the run writes, or None: a folder
    where a file goes, a file (or anything not a folder) where a folder goes."""
    if folder and path.exists() and not path.is_dir():
        return f"{path} is a file in the way"
    if not folder and path.is_dir():
        return f"{path} is a folder in the way"
    return None


DATASET_SUFFIXES = (".bin", ".idx")


def _later_datasets_in_the_way(cfg: PrepareConfig, files: Sequence[Path]) -> list[str]:
    """Folders named like a later dataset of a shard cut by `shard_size` (their number is
    known only once read): one listing of the output's folder."""
    if not cfg.shard_size:
        return []
    output = Path(cfg.output).expanduser()
    prefixes = {p for p, _ in planned_prefixes(output.name, shard_names(files),
                                               shard_counts(cfg))}
    try:
        entries = list(os.scandir(output.parent))
    except OSError:
        return []
    return [f"{entry.path} is a folder in the way" for entry in entries
            if entry.is_dir() and entry.name.endswith(DATASET_SUFFIXES)
            and sub_dataset_of(entry.name[:-4], prefixes)]


def outputs_in_the_way_problem(cfg: PrepareConfig, files: Sequence[Path]) -> str | None:
    """Something already holding a name the run writes would stop it with a traceback midway
    (a folder named `<output>.json` after the datasets are published): refused before any work,
    naming the first such path."""
    found = [p for p in (in_the_way(path, folder) for path, folder in written_paths(cfg, files))
             if p] + _later_datasets_in_the_way(cfg, files)
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f"output={cfg.output}: {found[0]}{more}; remove it or choose another output")


def _write_file(path: Path, text: str, work: Path) -> None:
    """Write a small file under the work folder, then rename it into place."""
    staged = work / path.name
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def megatron_blend(shards: Sequence[Shard], folder: Path, split: str) -> list[Any]:
    """Megatron-LM's `weight prefix ...` list of one split (token counts as weights)."""
    return [item for s in shards if s.split == split
            for item in (s.tokens, str(folder / s.prefix))]


def manifest(result: PrepareResult, cfg: PrepareConfig) -> dict[str, Any]:
    """`<output>.json`: the shards of each split (prefixes relative to this file's folder),
    their sizes and what identifies their files (`recipes/config/dataset_files.py`: checked
    before a run), a Megatron blend (token counts as weights) and what the ids mean."""
    tok = result.tokenizer

    def listed(split: str) -> list[dict[str, Any]]:
        return [{"prefix": s.prefix, "source": s.source, "documents": s.documents,
                 "empty": s.empty, "tokens": s.tokens, **s.files}
                for s in result.shards if s.split == split]

    return {
        "format": "megatron-core indexed dataset (.bin/.idx), one document per sequence",
        "tokenizer": result.tokenizer_dir.name,
        "eod_token": tok.eod_token,
        "eod_id": tok.eod_id,
        "vocab_size": tok.vocab_size,
        "dtype": result.dtype,
        "documents": result.documents,
        "empty": result.empty,
        "tokens": result.tokens,
        "shards": listed("train"),
        "valid_shards": listed("valid"),
        "test_shards": listed("test"),
        "blend": megatron_blend(result.shards, Path(), "train"),
        "megatron": {"data_args_path": result.data_args.name,
                     "per_split_data_args_path": result.per_split_args.name},
        "settings": {"text_field": cfg.text_field, "sample_by": cfg.sample_by,
                     "shard_size": cfg.shard_size, "num_shards": cfg.num_shards,
                     "valid_shards": cfg.valid_shards, "test_shards": cfg.test_shards,
                     "held_out_fraction": cfg.held_out_fraction,
                     "empty_documents": cfg.empty_documents, "seed": cfg.seed,
                     "tokenizer": cfg.tokenizer},
    }


def prepare(cfg: PrepareConfig, *, progress: bool | None = None,
            console: Console | None = None) -> PrepareResult:
    """Prepare every input of `cfg`; return what was written. User mistakes raise
    `ConfigError` before any dataset is published; the work folder is removed when the
    preparation completes (a killed one leaves it for the re-run, which redoes only the
    shards that are not complete). `progress`: show the bar (None: only on a terminal)."""
    files = validate(cfg)
    problem = outputs_in_the_way_problem(cfg, files)
    if problem:
        raise ConfigError(problem)
    _indexed_dataset_api()  # Megatron's import (seconds) is not part of the timed work
    started = time.perf_counter()
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    loaded = prepare_tokenizer(cfg) if cfg.train_vocab is None else None  # before any reading
    output = Path(cfg.output).expanduser()
    work = _work_folder(output)
    try:
        inputs = [read_input(path, cfg) for path in files]
        plans = planned(cfg, inputs, shard_names(files))
    except ConfigError:  # a bad input or plan: nothing to resume, nothing left behind
        shutil.rmtree(work, ignore_errors=True)
        raise
    prepared, train_seconds = loaded, 0.0
    if prepared is None:
        trained = time.perf_counter()
        prepared = prepare_tokenizer(cfg, _texts(inputs))
        train_seconds = time.perf_counter() - trained
    dtype = dataset_dtype(prepared.vocab_size)
    specs = task_specs(cfg, inputs, plans, prepared, dtype, output, work)
    records, redone = write_all(specs, cfg, _progress(progress, console or Console()))
    problem = empty_shard_problem(records, shard_counts(cfg), cfg.held_out_fraction,
                                  sum(source.size for source in inputs))
    if problem:  # before the manifest and Megatron-LM's blend files name it
        remove_refused(records, output, work)
        raise ConfigError(f"output={cfg.output}: {problem}; its datasets were removed")
    shards = shards_of(records)
    try:
        packs = write_pack_indexes(shards, output, cfg) if cfg.pack_size else ()
        result = _finish(cfg, output, work, prepared, shards, dtype, started, train_seconds)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        raise disk_full(cfg.output, err) from None
    shutil.rmtree(work, ignore_errors=True)
    earlier = earlier_datasets(output, [spec.plan.prefix for spec in specs],
                               {s.prefix for s in shards})
    return replace(result, packs=packs, pack_size=cfg.pack_size, pad_multiple=cfg.pad_multiple,
                   redone=redone, workers=min(cfg.num_proc, max(1, redone)),
                   empty_kept=cfg.empty_documents == "keep", tasks=len(specs),
                   earlier=tuple(earlier))


def remove_refused(records: Sequence[dict[str, Any]], output: Path, work: Path) -> None:
    """A run refused after its shards were written (one holds no tokens) leaves no dataset:
    the same command would be refused again, so nothing is kept for a resume. Its datasets,
    their records and the work folder go; an emptied records folder too."""
    folder = records_folder(output)
    for record in records:
        for dataset in record["datasets"]:
            for suffix in DATASET_SUFFIXES:
                (output.parent / f"{dataset['prefix']}{suffix}").unlink(missing_ok=True)
        record_path(folder, record["prefix"]).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    try:
        folder.rmdir()
    except OSError:
        pass  # records of other plans are left as they are


def earlier_datasets(output: Path, plan_prefixes: Sequence[str], listed: set[str]) -> list[str]:
    """Datasets of this output an earlier run wrote that the new manifest does not list (more
    shards or other inputs before; a shard cut by `shard_size` into more datasets): named in a
    note, never deleted, since they are the user's files."""
    folder = records_folder(output)
    known: set[str] = set()
    if folder.is_dir():
        for path in folder.glob("*.json"):
            record = read_record(folder, path.stem)
            known.update(d["prefix"] for d in (record or {}).get("datasets", []))
    prefixes = set(plan_prefixes)
    try:
        names = {p.name[:-4] for p in output.parent.iterdir() if p.name.endswith(".bin")}
    except OSError:
        return []
    return sorted(n for n in names - listed if n in known or sub_dataset_of(n, prefixes))


def write_pack_indexes(shards: Sequence[Shard], output: Path, cfg: PrepareConfig) -> tuple:
    """An exact packing index beside every dataset (data_prep/packing.py), before the manifest
    that marks the preparation complete; returns each shard's packing statistics."""
    from data_prep.packing import build_pack_index

    return tuple(build_pack_index(output.parent / shard.prefix, int(cfg.pack_size), seed=cfg.seed,
                                  pad_multiple=cfg.pad_multiple)
                 for shard in shards)


def write_tokenizer_folder(prepared: PreparedTokenizer, folder: Path, work: Path) -> None:
    """A Hugging Face tokenizer folder: tokenizer.json and the tokenizer_config.json that
    `transformers.AutoTokenizer` (and Megatron-LM's HuggingFaceTokenizer) read the EOS from."""
    staged = work / folder.name
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    (staged / "tokenizer.json").write_text(prepared.tokenizer.to_str(pretty=True) + "\n",
                                           encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": prepared.eod_token,
              "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30}
    (staged / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                  encoding="utf-8")
    special = {"eos_token": prepared.eod_token}
    (staged / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n",
                                                    encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staged, folder)


def _finish(cfg: PrepareConfig, output: Path, work: Path, prepared: PreparedTokenizer,
            shards: list[Shard], dtype: type[np.number], started: float,
            train_seconds: float) -> PrepareResult:
    """Publish the tokenizer, Megatron-LM's blend files and, last, the manifest (its
    presence means the run finished)."""
    tokenizer_dir = output_path(output, "tokenizer")
    write_tokenizer_folder(prepared, tokenizer_dir, work)
    result = PrepareResult(
        shards=tuple(shards), output=output, manifest=output_path(output, "manifest"),
        tokenizer_dir=tokenizer_dir, tokenizer=prepared, dtype=np.dtype(dtype).name,
        seconds=0.0, train_seconds=train_seconds,
        data_args=output_path(output, "data_args"),
        per_split_args=output_path(output, "per_split_args"),
    )
    folder = resolved(output.parent)
    train = megatron_blend(shards, folder, "train")
    _write_file(result.data_args, " ".join(map(str, train)) + "\n", work)
    per_split = {split: megatron_blend(shards, folder, split) for split in SPLITS}
    _write_file(result.per_split_args, json.dumps(
        {k: v for k, v in per_split.items() if v}, indent=2) + "\n", work)
    _write_file(result.manifest, json.dumps(manifest(result, cfg), indent=2) + "\n", work)
    seconds = time.perf_counter() - started
    return replace(result, seconds=seconds)


# ----------------------------------------------------------------------------- summary

SHOWN_SHARDS = 20  # the summary table lists this many shards, then a count of the rest


def summary_line(result: PrepareResult) -> str:
    tok = result.tokenizer
    eod = f"EOD {tok.eod_token} = id {tok.eod_id}" + (" (added)" if tok.eod_added else "")
    trained = f", tokenizer trained in {result.train_seconds:.1f} s" if result.train_seconds else ""
    kept = "zero-length" if result.empty_kept else "skipped"
    complete = already_complete(result.tasks, result.redone)
    resumed = f" ({complete} already complete)" if complete else ""
    return (
        f"prepared {result.documents:,} documents ({result.empty:,} empty, {kept}), "
        f"{result.tokens:,} tokens in {len(result.shards)} shard(s){resumed}, "
        f"{result.tokens_per_second:,.0f} tokens/s over {result.seconds:.1f} s "
        f"({result.workers} worker(s)){trained}; "
        f"{result.dtype}, vocab {tok.vocab_size:,}, {eod}; manifest {result.manifest}; "
        f"Megatron-LM: --data-args-path {result.data_args} --tokenizer-type "
        f"HuggingFaceTokenizer --tokenizer-model {result.tokenizer_dir}"
        + _packing_text(result)
    )


def already_complete(tasks: int, redone: int) -> int:
    """Shard tasks found complete (kept, not rerun). Counted in tasks, not datasets: a task cut
    by `shard_size` writes several datasets, so datasets minus tasks run is no count at all."""
    return max(tasks - redone, 0)


EARLIER_SHOWN = 3  # earlier datasets named in the note, then "..."


def earlier_note(result: PrepareResult) -> str | None:
    """The note naming earlier datasets of this prefix the manifest no longer lists."""
    if not result.earlier:
        return None
    shown = ", ".join(result.earlier[:EARLIER_SHOWN])
    more = ", ..." if len(result.earlier) > EARLIER_SHOWN else ""
    return (f"note: output={result.output}: {len(result.earlier)} earlier datasets not in this "
            f"manifest ({shown}{more}); delete them")


def _packing_text(result: PrepareResult) -> str:
    if not result.packs:
        return ""
    packs = sum(s.packs for s in result.packs)
    bound = sum(s.lower_bound for s in result.packs)
    tokens = sum(s.tokens for s in result.packs)
    efficiency = tokens / (packs * int(result.pack_size or 1)) if packs else 0.0
    padded = (f", each document padded to a multiple of {result.pad_multiple}"
              if result.pad_multiple > 1 else "")
    return (f"; {packs:,} packs of {result.pack_size:,} tokens (lower bound {bound:,}{padded}), "
            f"packing efficiency {efficiency:.2%}")


def summary_table(result: PrepareResult) -> Table:
    per_worker = result.tokens_per_second / max(1, result.workers)
    table = Table(title=f"prepared datasets ({per_worker:,.0f} tokens/s per worker)",
                  title_justify="left")
    for column in ("dataset", "split", "documents", "empty", "tokens", "source"):
        table.add_column(column, justify="left" if column in ("dataset", "split", "source")
                         else "right")
    for shard in result.shards[:SHOWN_SHARDS]:
        table.add_row(shard.prefix, shard.split, f"{shard.documents:,}", f"{shard.empty:,}",
                      f"{shard.tokens:,}", shard.source)
    if len(result.shards) > SHOWN_SHARDS:
        table.add_row(f"... {len(result.shards) - SHOWN_SHARDS} more (see the manifest)",
                      "", "", "", "", "")
    table.add_row("total", "", f"{result.documents:,}", f"{result.empty:,}",
                  f"{result.tokens:,}", "", style="bold")
    return table


def source_table(result: PrepareResult) -> Table:
    """The source at a glance: per split its shards, documents, empty ones (kept as
    zero-length documents, or skipped), tokens; the total with tokens/s per worker."""
    kept = "zero-length" if result.empty_kept else "skipped"
    table = Table(title=f"source {result.output.name}", title_justify="left")
    for column in ("split", "shards", "documents", f"empty ({kept})", "tokens",
                   "tokens/s per worker"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split in SPLITS:
        shards = [s for s in result.shards if s.split == split]
        if shards:
            table.add_row(split, f"{len(shards):,}", f"{sum(s.documents for s in shards):,}",
                          f"{sum(s.empty for s in shards):,}",
                          f"{sum(s.tokens for s in shards):,}", "")
    per_worker = result.tokens_per_second / max(1, result.workers)
    table.add_row("total", f"{len(result.shards):,}", f"{result.documents:,}",
                  f"{result.empty:,}", f"{result.tokens:,}",
                  f"{per_worker:,.0f} ({result.workers} worker(s))", style="bold")
    return table


def print_summary(result: PrepareResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(source_table(result))
    console.print(summary_table(result))
    console.print(summary_line(result), soft_wrap=True, highlight=False)
    note = earlier_note(result)
    if note:
        console.print(note, soft_wrap=True, highlight=False)

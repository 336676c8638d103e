"""Local text, JSONL and Parquet -> Megatron Core indexed datasets (`.bin`/`.idx`), one per
input file, plus a manifest (`<output>.json`) a blend can name and the tokenizer used.

Why it is built this way:
- Files are read through `datasets` (its packaged text/json/parquet builders, offline, cached in
  a work folder that is removed afterwards), so every format and compression it knows works and
  tokenizing runs in `num_proc` processes through its batched `map`.
- The work is done window by window (about 16 MiB of text per process): the progress bar moves
  during a long file, memory stays bounded, and nothing is cached on disk but the Arrow copy.
- Datasets are written only through Megatron Core's `IndexedDatasetBuilder` (one document per
  sequence, as Megatron's own preprocess_data does) into a hidden work folder beside the output,
  then published by rename when complete: an interrupted run leaves no file named like a
  dataset, and a re-run first removes the old `.idx`, so old and new halves never pair up.
- Everything that can be a user mistake (paths, fields, an unreadable file or tokenizer) is
  checked before the first dataset is written, as one-line `ConfigError`s.
- Same inputs, same outputs, byte for byte: input order is sorted, nothing is shuffled, the BPE
  trainer is deterministic (see `data_prep/hf_tokenizer.py`), and the manifest holds no times or
  absolute paths of its own.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import logging
import os
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never reach the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table  # noqa: E402

from data_prep.config import PrepareConfig, input_format, shard_names, validate  # noqa: E402
from data_prep.hf_tokenizer import (  # noqa: E402
    PreparedTokenizer,
    prepare_tokenizer,
    serial_tokenizers,
)
from plugins.protocol.errors import ConfigError  # noqa: E402
from recipes.config.dataset_files import record  # noqa: E402

WINDOW_BYTES = 16 << 20  # text tokenized per process between two writes / progress updates
WINDOW_ROWS = 1 << 20  # and at most this many documents per process (many tiny lines)
MAP_BATCH = 1000  # documents per encode_batch call
FORMAT_NAMES = {"text": "text", "json": "JSON lines", "parquet": "Parquet"}
TOKENS_FEATURES = datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})


@dataclass(frozen=True)
class Shard:
    """One written dataset; `prefix` is relative to the manifest's folder."""

    prefix: str
    source: str
    documents: int
    skipped_empty: int
    tokens: int


@dataclass(frozen=True)
class PrepareResult:
    """What a preparation wrote and how fast."""

    shards: tuple[Shard, ...]
    output: Path  # the prefix: datasets are <output>_<name>.bin/.idx
    manifest: Path  # <output>.json
    tokenizer_file: Path  # <output>.tokenizer.json
    tokenizer: PreparedTokenizer
    dtype: str  # uint16 or int32
    seconds: float  # the whole preparation, tokenizer training included
    train_seconds: float  # training the tokenizer (0 when loaded)
    pack_size: int | None = None  # rows of the packing indexes written (pack_size=)
    packs: tuple = ()  # PackingStats of each shard's packing index
    pad_multiple: int = 1  # documents padded to multiples of this in those indexes

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def skipped_empty(self) -> int:
        return sum(s.skipped_empty for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class _Corpus:
    """One input file read into Arrow: the rows and the column that holds the text."""

    path: Path
    name: str
    data: datasets.Dataset
    column: str


# ----------------------------------------------------------------------------- reading


def _quiet_libraries() -> None:
    """datasets' own bars and logs would interleave with this module's progress bar."""
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)  # a bad file is one error line


def _reason(err: BaseException) -> str:
    """The first error under datasets' own wrappers ('An error occurred while generating the
    dataset'): the parser's words, e.g. 'ArrowInvalid: JSON parse error: ... in row 1'."""
    found: BaseException | None = err
    while isinstance(found, datasets.exceptions.DatasetsError):
        found = found.__cause__ or found.__context__
    found = found or err
    text = str(found).strip().splitlines()
    return f"{type(found).__name__}: {text[0]}" if text else type(found).__name__


def read_corpus(path: Path, name: str, cfg: PrepareConfig, cache: Path) -> _Corpus:
    """Read one input file with datasets' packaged builder; check its text field."""
    fmt = input_format(path)
    assert fmt is not None  # resolve_inputs refused unknown formats
    options: dict[str, Any] = {"sample_by": cfg.sample_by} if fmt == "text" else {}
    try:
        data = datasets.load_dataset(
            fmt, data_files=[str(path)], split="train", cache_dir=str(cache), **options
        )
    except Exception as err:  # any failure to parse a user's file is that file's problem
        raise ConfigError(
            f"input file {path} cannot be read as {FORMAT_NAMES[fmt]} ({_reason(err)}); "
            "fix the file or remove it from input="
        ) from None
    column = "text" if fmt == "text" else cfg.text_field
    _check_text_column(path, data, column, fmt)
    return _Corpus(path=path, name=name, data=data, column=column)


def _is_text(feature: Any) -> bool:
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _check_text_column(path: Path, data: datasets.Dataset, column: str, fmt: str) -> None:
    """The column exists, holds text, and not only empty documents."""
    fields = data.column_names
    if column not in fields:
        near = difflib.get_close_matches(column, fields, n=1, cutoff=0.5)
        texts = [f for f in fields if _is_text(data.features[f])]
        hint = near[0] if near and near[0] in texts else (texts[0] if texts else None)
        fix = f"set text_field={hint}" if hint else "give files with a text field"
        raise ConfigError(
            f"input file {path} has no field '{column}'; its fields are "
            f"{', '.join(fields) or 'none'}; {fix}"
        )
    feature = data.features[column]
    if not _is_text(feature):
        texts = [f for f in fields if _is_text(data.features[f])]
        fix = f"text fields: {', '.join(texts)}" if texts else "the file has no text field"
        raise ConfigError(
            f"input file {path}: field '{column}' holds {_describe(feature)}, not text; "
            f"set text_field to a text field ({fix})"
        )
    if not _has_text(data, column):
        what = "lines" if fmt == "text" and data.num_rows > 1 else "documents"
        raise ConfigError(
            f"input file {path} has no text: all {data.num_rows} {what} are empty; "
            "remove it from input="
        )


def _describe(feature: Any) -> str:
    return feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__


def _has_text(data: datasets.Dataset, column: str) -> bool:
    """Whether any document is more than whitespace (chunk by chunk: bounded memory)."""
    for chunk in data.data.column(column).chunks:
        lengths = pc.binary_length(pc.utf8_trim_whitespace(chunk))
        if pc.any(pc.greater(lengths, 0)).as_py():
            return True
    return False


def _texts(corpora: Sequence[_Corpus]) -> Iterator[list[str]]:
    """Every non-empty document, in batches, in input order (what train:VOCAB learns from)."""
    for corpus in corpora:
        for batch in corpus.data.iter(batch_size=MAP_BATCH):
            yield [t for t in batch[corpus.column] if t and not t.isspace()]


# ----------------------------------------------------------------------------- tokenizing


class Encoder:
    """The batched map function: the tokenizer's encoding of each document plus the EOD id;
    an empty (or whitespace-only) document becomes an empty list, skipped by the writer.

    A class rather than a closure so `datasets` can pickle it to its worker processes.
    """

    def __init__(self, prepared: PreparedTokenizer, column: str) -> None:
        self.tokenizer = prepared.tokenizer
        self.eod_id = prepared.eod_id
        self.column = column

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        texts = batch[self.column]
        keep = [i for i, text in enumerate(texts) if text and not text.isspace()]
        encoded = self.tokenizer.encode_batch_fast([texts[i] for i in keep])
        ids: list[list[int]] = [[] for _ in texts]
        for i, encoding in zip(keep, encoded, strict=True):
            tokens = encoding.ids
            if tokens:  # a tokenizer may map some text to nothing: that is empty too
                tokens.append(self.eod_id)
                ids[i] = tokens
        return {"input_ids": ids}


def windows(data: datasets.Dataset, column: str, num_proc: int) -> list[tuple[int, int]]:
    """Row ranges of about WINDOW_BYTES of text per process (at most WINDOW_ROWS rows)."""
    rows = data.num_rows
    chunks = data.data.column(column).chunks
    sizes = np.concatenate(
        [pc.binary_length(c).fill_null(0).to_numpy(zero_copy_only=False) for c in chunks]
    ) if chunks else np.zeros(0, np.int64)
    ends = np.cumsum(sizes, dtype=np.int64)
    budget = WINDOW_BYTES * num_proc
    marks = np.arange(budget, int(ends[-1]) if rows else 0, budget, dtype=np.int64)
    cuts = np.searchsorted(ends, marks, side="left") + 1
    by_rows = np.arange(WINDOW_ROWS * num_proc, rows, WINDOW_ROWS * num_proc)
    bounds = np.unique(np.concatenate([[0, rows], np.minimum(cuts, rows), by_rows]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def tokenize(corpus: _Corpus, start: int, stop: int, encoder: Encoder,
             num_proc: int) -> pa.ChunkedArray:
    """Token ids (a list per row) of rows [start, stop), through datasets' batched map."""
    window = corpus.data.select(range(start, stop))
    procs = min(num_proc, stop - start)
    mapped = window.map(
        encoder,
        batched=True,
        batch_size=MAP_BATCH,
        num_proc=procs if procs > 1 else None,
        remove_columns=window.column_names,
        features=TOKENS_FEATURES,
        keep_in_memory=True,
        new_fingerprint=f"{corpus.name[:30]}-{start}-{stop}".replace(".", "_"),
    )
    return mapped.data.column("input_ids")


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


def publish(work_prefix: Path, final_prefix: Path) -> None:
    """Move a finished dataset into place: the old `.idx` goes first, the new `.idx` last, so
    at no moment does a `.bin`/`.idx` pair exist that was not written together."""
    final_prefix.with_name(final_prefix.name + ".idx").unlink(missing_ok=True)
    for suffix in (".bin", ".idx"):
        os.replace(work_prefix.with_name(work_prefix.name + suffix),
                   final_prefix.with_name(final_prefix.name + suffix))


class ShardWriter:
    """Writes one input's documents into indexed datasets in the work folder and publishes
    each when complete; with shard_size, a new dataset every shard_size documents."""

    def __init__(self, name: str, source: Path, output: Path, work: Path,
                 dtype: type[np.number], shard_size: int | None) -> None:
        self.name, self.source, self.output, self.work = name, source, output, work
        self.dtype, self.shard_size = dtype, shard_size
        self.shards: list[Shard] = []
        self.builder: Any = None
        self.documents = self.skipped = self.tokens = 0

    def _prefix(self) -> str:
        base = f"{self.output.name}_{self.name}"
        return f"{base}_{len(self.shards):05d}" if self.shard_size else base

    def _open(self) -> None:
        builder_class = _indexed_dataset_api()[0]
        self.builder = builder_class(str(self.work / f"{self._prefix()}.bin"), self.dtype)

    def add(self, tokens: np.ndarray) -> None:
        if self.builder is None:
            self._open()
        self.builder.add_document(tokens, [tokens.size])
        self.documents += 1
        self.tokens += tokens.size
        if self.shard_size and self.documents == self.shard_size:
            self._finish_part()

    def skip(self, count: int) -> None:
        self.skipped += count

    def _finish_part(self) -> None:
        prefix = self._prefix()
        self.builder.finalize(str(self.work / f"{prefix}.idx"))
        publish(self.work / prefix, self.output.with_name(prefix))
        self.shards.append(Shard(prefix, str(self.source), self.documents, self.skipped,
                                 self.tokens))
        self.builder, self.documents, self.skipped, self.tokens = None, 0, 0, 0

    def close(self) -> list[Shard]:
        """Publish the open dataset; empties after a full last part are counted there."""
        if self.builder is None and self.shards:
            last = self.shards[-1]
            self.shards[-1] = replace(last, skipped_empty=last.skipped_empty + self.skipped)
            self.skipped = 0
            return self.shards
        if self.builder is None:  # every document encoded to nothing: an empty dataset
            self._open()
        self._finish_part()
        return self.shards


def write_ids(writer: ShardWriter, ids: pa.ChunkedArray, dtype: type[np.number]) -> None:
    """Every row of a window's token lists into the writer, the empty ones counted."""
    for chunk in ids.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy()[offsets[0]:offsets[-1]].astype(dtype, copy=False)
        offsets = offsets - offsets[0]
        lengths = np.diff(offsets)
        writer.skip(int(np.count_nonzero(lengths == 0)))
        for i in np.flatnonzero(lengths).tolist():
            writer.add(values[offsets[i]:offsets[i + 1]])


# ----------------------------------------------------------------------------- the run


def _progress(enabled: bool | None, console: Console) -> Progress:
    """A bar over documents; off when the output is not a terminal (logs, tests, pipes)."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("docs  {task.fields[tokens]:,} tokens"), TimeElapsedColumn(),
        TimeRemainingColumn(), console=console, auto_refresh=False,
        disable=not (console.is_terminal if enabled is None else enabled),
    )


def write_corpus(corpus: _Corpus, cfg: PrepareConfig, encoder: Encoder, output: Path,
                 work: Path, dtype: type[np.number], bar: Progress) -> list[Shard]:
    """Tokenize one input window by window and write its dataset(s)."""
    writer = ShardWriter(corpus.name, corpus.path, output, work, dtype, cfg.shard_size)
    task = bar.add_task(corpus.name, total=corpus.data.num_rows, tokens=0)
    tokens = 0
    for start, stop in windows(corpus.data, corpus.column, cfg.num_proc):
        write_ids(writer, tokenize(corpus, start, stop, encoder, cfg.num_proc), dtype)
        tokens = sum(s.tokens for s in writer.shards) + writer.tokens
        bar.update(task, completed=stop, tokens=tokens, refresh=True)
    return writer.close()


def _work_folder(output: Path) -> Path:
    """A hidden folder beside the output (same filesystem, so publishing is a rename)."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp",
                                     dir=output.parent))
    except OSError as err:
        raise ConfigError(
            f"output={output}: cannot write in {output.parent} ({err.strerror}); "
            "choose another output"
        ) from None


def _write_file(path: Path, text: str, work: Path) -> None:
    """Write a small file under the work folder, then rename it into place."""
    staged = work / path.name
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def manifest(result: PrepareResult, cfg: PrepareConfig) -> dict[str, Any]:
    """`<output>.json`: the shards (prefixes relative to this file's folder), their sizes and
    what identifies their files (`recipes/config/dataset_files.py`: checked before a run), a
    Megatron blend (token counts as weights) and what the ids mean."""
    tok = result.tokenizer
    return {
        "format": "megatron-core indexed dataset (.bin/.idx), one document per sequence",
        "tokenizer": result.tokenizer_file.name,
        "eod_token": tok.eod_token,
        "eod_id": tok.eod_id,
        "vocab_size": tok.vocab_size,
        "dtype": result.dtype,
        "documents": result.documents,
        "skipped_empty": result.skipped_empty,
        "tokens": result.tokens,
        "shards": [{**asdict(shard), **record(str(result.output.parent / shard.prefix))}
                   for shard in result.shards],
        "blend": [item for s in result.shards for item in (s.tokens, s.prefix)],
        "settings": {"text_field": cfg.text_field, "sample_by": cfg.sample_by,
                     "shard_size": cfg.shard_size, "seed": cfg.seed, "tokenizer": cfg.tokenizer},
    }


def prepare(cfg: PrepareConfig, *, progress: bool | None = None,
            console: Console | None = None) -> PrepareResult:
    """Prepare every input of `cfg`; return what was written. User mistakes raise
    `ConfigError` before any dataset is published; the work folder is always removed.
    `progress`: show the bar (None: only on a terminal)."""
    files = validate(cfg)
    _indexed_dataset_api()  # Megatron's import (seconds) is not part of the timed work
    started = time.perf_counter()
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    _quiet_libraries()
    loaded = prepare_tokenizer(cfg) if cfg.train_vocab is None else None  # before any reading
    output = Path(cfg.output).expanduser()
    work = _work_folder(output)
    try:
        corpora = [read_corpus(path, name, cfg, work / "cache")
                   for path, name in zip(files, shard_names(files), strict=True)]
        prepared, train_seconds = loaded, 0.0
        if prepared is None:
            trained = time.perf_counter()
            rows = sum(c.data.num_rows for c in corpora)
            prepared = prepare_tokenizer(cfg, _texts(corpora), length=-(-rows // MAP_BATCH))
            train_seconds = time.perf_counter() - trained
        dtype = dataset_dtype(prepared.vocab_size)
        shards = write_all(corpora, cfg, prepared, output, work, dtype,
                           _progress(progress, console or Console()))
        packs = write_pack_indexes(shards, output, cfg) if cfg.pack_size else ()
        result = _finish(cfg, output, work, prepared, shards, dtype, started, train_seconds)
        return replace(result, packs=packs, pack_size=cfg.pack_size,
                       pad_multiple=cfg.pad_multiple)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_all(corpora: Sequence[_Corpus], cfg: PrepareConfig, prepared: PreparedTokenizer,
              output: Path, work: Path, dtype: type[np.number], bar: Progress) -> list[Shard]:
    """Every input's dataset(s), in input order. With num_proc > 1 the worker processes are
    the parallelism, so the tokenizer's own thread pool is off (in them and here)."""
    shards: list[Shard] = []
    threads = serial_tokenizers() if cfg.num_proc > 1 else contextlib.nullcontext()
    with threads, bar:
        for corpus in corpora:
            encoder = Encoder(prepared, corpus.column)
            shards += write_corpus(corpus, cfg, encoder, output, work, dtype, bar)
    return shards


def write_pack_indexes(shards: Sequence[Shard], output: Path, cfg: PrepareConfig) -> tuple:
    """An exact packing index beside every dataset (data_prep/packing.py), before the manifest
    that marks the preparation complete; returns each shard's packing statistics."""
    from data_prep.packing import build_pack_index

    return tuple(build_pack_index(output.parent / shard.prefix, int(cfg.pack_size), seed=cfg.seed,
                                  pad_multiple=cfg.pad_multiple)
                 for shard in shards)


def _finish(cfg: PrepareConfig, output: Path, work: Path, prepared: PreparedTokenizer,
            shards: list[Shard], dtype: type[np.number], started: float,
            train_seconds: float) -> PrepareResult:
    """Publish the tokenizer and, last, the manifest (its presence means the run finished)."""
    tokenizer_file = output.with_name(output.name + ".tokenizer.json")
    _write_file(tokenizer_file, prepared.tokenizer.to_str(pretty=True) + "\n", work)
    result = PrepareResult(
        shards=tuple(shards), output=output, manifest=output.with_name(output.name + ".json"),
        tokenizer_file=tokenizer_file, tokenizer=prepared, dtype=np.dtype(dtype).name,
        seconds=0.0, train_seconds=train_seconds,
    )
    _write_file(result.manifest, json.dumps(manifest(result, cfg), indent=2) + "\n", work)
    seconds = time.perf_counter() - started
    return replace(result, seconds=seconds)


# ----------------------------------------------------------------------------- summary

SHOWN_SHARDS = 20  # the summary table lists this many shards, then a count of the rest


def summary_line(result: PrepareResult) -> str:
    tok = result.tokenizer
    eod = f"EOD {tok.eod_token} = id {tok.eod_id}" + (" (added)" if tok.eod_added else "")
    trained = f", tokenizer trained in {result.train_seconds:.1f} s" if result.train_seconds else ""
    return (
        f"prepared {result.documents:,} documents ({result.skipped_empty:,} empty skipped), "
        f"{result.tokens:,} tokens in {len(result.shards)} shard(s), "
        f"{result.tokens_per_second:,.0f} tokens/s over {result.seconds:.1f} s{trained}; "
        f"{result.dtype}, vocab {tok.vocab_size:,}, {eod}; manifest {result.manifest}"
        + _packing_text(result)
    )


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
    table = Table(title="prepared datasets", title_justify="left")
    for column in ("dataset", "documents", "skipped empty", "tokens", "source"):
        table.add_column(column, justify="left" if column in ("dataset", "source") else "right")
    for shard in result.shards[:SHOWN_SHARDS]:
        table.add_row(shard.prefix, f"{shard.documents:,}", f"{shard.skipped_empty:,}",
                      f"{shard.tokens:,}", shard.source)
    if len(result.shards) > SHOWN_SHARDS:
        table.add_row(f"... {len(result.shards) - SHOWN_SHARDS} more (see the manifest)",
                      "", "", "", "")
    table.add_row("total", f"{result.documents:,}", f"{result.skipped_empty:,}",
                  f"{result.tokens:,}", "", style="bold")
    return table


def print_summary(result: PrepareResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(result))
    console.print(summary_line(result), soft_wrap=True, highlight=False)

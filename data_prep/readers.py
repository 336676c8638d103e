"""Input files read as streams: a range of one file at a time, a batch of documents at a time.

Why it is built this way:
- The driver plans from what it can learn in O(files): each file's size, a Parquet file's row
  count (its footer), and a bounded look at its head (`inspect`: the text field exists and
  holds text, a small file is not all empty, the first lines parse). The work that grows with
  the corpus (reading, parsing, tokenizing) happens in the shard tasks, each on its own range.
- A range of a plain JSONL or text file (`sample_by=line`) is a byte range: a line belongs to
  the range holding its first byte, so ranges cut anywhere give every line exactly once. A
  Parquet range is a row range, read row group by row group. A compressed file (.gz, .bz2,
  .xz, .zst) cannot be entered in the middle: it is one range, decompressed as a stream. So is
  a text file read by paragraph or as one document, and a `.json` file holding one array.
- The documents are the ones `datasets`' packaged builders produced before: text lines split on
  universal newlines without the line break, paragraphs split on blank lines, JSON rows whose
  field is missing or null empty; memory is bounded by a read chunk and a batch, never a file.
- A compressed file can be damaged anywhere (a truncated download, zeroed blocks): the
  decompressor then raises its own exception (EOFError, OSError, zlib or lzma errors, Arrow's)
  deep in a task, possibly in a worker process. Every read of a decompressed stream goes through
  `_Decompressed`, which turns that into one line naming the file and how far its decompressed
  text got, so the driver and every worker stop with the same `error:` line, never a traceback.
  A Parquet file whose footer reads can still hold a damaged data page (Arrow's OSError or
  ArrowException from `iter_batches`): the same kind of line names the file and row group.
- A position named in an error is a byte of the file (of its decompressed text when
  compressed), never a column within a line, so the user can go straight to it.
- A UTF-8 byte order mark opening a file is no text (Python's `utf-8-sig`): `without_bom`
  drops it from the file's first line or whole text, never elsewhere. A Parquet text column
  may be string, large_string, string_view or a dictionary of one (pandas `category`):
  `text_values` decodes each batch to Python strings.
"""

from __future__ import annotations

import bz2
import codecs
import difflib
import gzip
import json
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from plugins.protocol.errors import ConfigError

CHUNK = 1 << 20  # bytes read at a time from a file
BATCH = 1000  # documents handed to the tokenizer at a time
HEAD_BYTES = 1 << 20  # what the pre-flight reads of each file
FORMAT_NAMES = {"text": "text", "json": "JSON lines", "parquet": "Parquet"}
BOM = codecs.BOM_UTF8
Progress = Callable[[float], None]  # the share of the range read so far


class InputError(ConfigError):
    """A file that cannot be read as what its name says (found by a task, mid-file)."""


@dataclass(frozen=True)
class InputFile:
    """One input as a task needs it: where, how to read it, and how it can be cut."""

    path: str
    fmt: str  # text, json, parquet
    compression: str | None  # .gz, .bz2, .xz, .zst or None
    column: str  # the field holding the text ("text" for text files)
    sample_by: str  # text files: line, paragraph, document
    size: int  # bytes on disk (what the plan balances)
    units: int  # what a range counts: bytes (plain lines), rows (Parquet), 1 (one stream)
    array: bool = False  # a .json file holding one JSON array, not JSON lines

    @property
    def splittable(self) -> bool:
        return self.units > 1 or self.fmt == "parquet"


# ----------------------------------------------------------------------------- streams


# What a decompressor raises on damaged input: gzip's BadGzipFile and bz2's "Invalid data
# stream" are OSErrors, a truncated .gz/.bz2/.xz an EOFError, Arrow's zstd an OSError
# ("Truncated compressed stream") or ArrowInvalid (a ValueError).
DAMAGE = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)


MAGIC = {".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00", ".zst": b"\x28\xb5\x2f\xfd"}


def _is_compressed_as(path: str, compression: str) -> bool:
    """The file starts with its compression's magic bytes (else it holds something else)."""
    try:
        with open(path, "rb") as stream:
            return stream.read(len(MAGIC[compression])) == MAGIC[compression]
    except OSError:
        return False


def damaged(path: str, compression: str, position: int, err: BaseException) -> InputError:
    """The one line for a compressed input that stops decompressing `position` bytes in."""
    reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}"
    if position == 0 and not _is_compressed_as(path, compression):
        return InputError(f"input file {path} is not a {compression} file (its first bytes are "
                          f"not {compression}'s {MAGIC[compression]!r}; {reason}); compress it "
                          "again, or give it the suffix of what it holds")
    where = f"at byte {position:,} of its decompressed text" if position else "while decompressing"
    return InputError(f"input file {path} is damaged or truncated ({reason}) {where}; download "
                      "or compress it again")


class _Decompressed:
    """A decompressed stream whose damage is one `InputError` naming the byte reached."""

    def __init__(self, stream: Any, path: str, compression: str) -> None:
        self.stream, self.path, self.compression = stream, path, compression
        self.position = 0  # decompressed bytes read so far

    def read(self, size: int = -1) -> bytes:
        try:
            chunk = self.stream.read() if size is None or size < 0 else self.stream.read(size)
        except DAMAGE as err:
            raise damaged(self.path, self.compression, self.position, err) from None
        self.position += len(chunk)
        return chunk


def _decompressor(raw: BinaryIO, compression: str) -> Any:
    if compression == ".gz":
        return gzip.GzipFile(fileobj=raw)
    if compression == ".bz2":
        return bz2.BZ2File(raw)
    if compression == ".xz":
        return lzma.LZMAFile(raw)
    import pyarrow as pa

    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")


def _opened(path: str, compression: str | None) -> tuple[BinaryIO, BinaryIO]:
    """(the raw file, the decompressed stream over it); the raw one tells the progress."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if compression is None:
        return raw, raw
    try:
        stream = _decompressor(raw, compression)
    except DAMAGE as err:  # Arrow may read the first frame here
        raw.close()
        raise damaged(path, compression, 0, err) from None
    return raw, _Decompressed(stream, path, compression)  # type: ignore[return-value]


def _lines(stream: BinaryIO, position: int, stop: int | None,
           drop: bool) -> Iterator[tuple[int, bytes]]:
    """(offset, line without b"\\n") of the lines starting before `stop` of a stream at
    `position`; `drop`: the stream is one byte before its range, so the first piece (the end
    of the line before the range, or nothing) belongs to the range before."""
    pending = b""
    while stop is None or position < stop:
        chunk = stream.read(CHUNK)
        if not chunk:
            if pending and not drop:
                yield position, pending
            return
        pieces = (pending + chunk).split(b"\n")
        pending = pieces.pop()
        for piece in pieces:
            if not drop:
                if stop is not None and position >= stop:
                    return
                yield position, piece
            drop = False
            position += len(piece) + 1


def not_utf8(path: str, err: UnicodeDecodeError, offset: int) -> InputError:
    """Bad UTF-8 `err.start` bytes into text that starts at byte `offset` of the file."""
    return InputError(f"input file {path} cannot be read as text (invalid UTF-8: "
                      f"{err.object[err.start:err.start + 4]!r} at byte {offset + err.start:,}: "
                      f"{err.reason}); fix the file or remove it from input=")


def without_bom(data: bytes, offset: int) -> tuple[bytes, int]:
    """(`data` without a UTF-8 byte order mark, the byte it now starts at): the mark is
    dropped only where `data` starts the file (`offset` 0), as `utf-8-sig` reads a file."""
    if offset == 0 and data.startswith(BOM):
        return data[len(BOM):], len(BOM)
    return data, offset


def _line_documents(line: bytes, path: str, offset: int = 0) -> list[str]:
    """One line (starting at byte `offset`) of a text file as the documents universal
    newlines make of it."""
    line, offset = without_bom(line, offset)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, offset) from None
    if text.endswith("\r"):
        text = text[:-1]
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if "\r" in text else [text]


def _json_type(value: Any) -> str:
    names = {bool: "bool", int: "int64", float: "double", list: "list", dict: "struct"}
    return names.get(type(value), type(value).__name__)


def _json_text(row: Any, column: str, path: str, where: str) -> str | None:
    if not isinstance(row, dict):
        raise InputError(f"input file {path} cannot be read as JSON lines ({where} is "
                         f"{_json_type(row)}, not an object); fix the file or remove it from "
                         "input=")
    value = row.get(column)
    if value is not None and not isinstance(value, str):
        raise InputError(f"input file {path}: field '{column}' holds {_json_type(value)} "
                         f"({where}), not text; set text_field to a text field")
    return value


def _json_row(line: bytes, path: str, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as err:
        reason = str(err).splitlines()[0]
        raise InputError(f"input file {path} cannot be read as JSON lines ({type(err).__name__}: "
                         f"{reason} in the line at byte {number}); fix the file or remove it "
                         "from input=") from None


def _json_documents(lines: Iterator[tuple[int, bytes]], column: str,
                    path: str) -> Iterator[str | None]:
    for offset, line in lines:
        if line.strip():
            yield _json_text(_json_row(line, path, offset), column, path, f"byte {offset}")


def _paragraphs(stream: BinaryIO, path: str) -> Iterator[str]:
    """Paragraphs (split on blank lines, empty ones dropped) of a whole text stream."""
    pending = ""
    for offset, line in _lines(stream, 0, None, False):
        for text in _line_documents(line, path, offset):
            pending += text + "\n"
            pieces = pending.split("\n\n")
            pending = pieces.pop()
            yield from (p for p in pieces if p)
    pending = pending[:-1] if pending.endswith("\n") else pending
    if pending:
        yield pending


def _array_rows(stream: BinaryIO, path: str) -> list[Any]:
    """The items of a `.json` file holding one JSON array (read whole: it cannot be cut)."""
    try:
        rows = json.load(stream)  # type: ignore[arg-type]
    except InputError:
        raise
    except ValueError as err:
        raise InputError(f"input file {path} cannot be read as JSON ({err}); fix the file or "
                         "remove it from input=") from None
    if not isinstance(rows, list):
        raise InputError(f"input file {path} holds one JSON {_json_type(rows)}, not an array "
                         "of objects or JSON lines; fix the file or remove it from input=")
    return rows


def _array_documents(stream: BinaryIO, column: str, path: str) -> Iterator[str | None]:
    for index, row in enumerate(_array_rows(stream, path)):
        yield _json_text(row, column, path, f"item {index}")


def parquet_damaged(path: str, group: int, err: BaseException) -> InputError:
    """The one line for a Parquet file whose footer reads but whose data does not (a damaged
    page: Arrow raises OSError or an ArrowException deep in a task, possibly in a worker)."""
    reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}"
    return InputError(f"input file {path} is damaged ({reason}) in row group {group}; download "
                      "or write it again, or remove it from input=")


def is_text_type(kind: Any) -> bool:
    """An Arrow type whose values are text: string, large_string, string_view, or a
    dictionary of one (what pandas writes for a `category` column)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_view(kind)


def text_values(column: Any) -> list[str | None]:
    """One batch of a text column as Python strings (None: null): a dictionary is decoded and
    a string_view cast to large_string first, so every text type reads the same."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.large_string())
    return column.to_pylist()


def _parquet_documents(source: InputFile, start: int, stop: int,
                       progress: Progress | None) -> Iterator[str | None]:
    """Rows [start, stop) of the text column, row group by row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(source.path)
    first = 0
    for group in range(handle.num_row_groups):
        rows = handle.metadata.row_group(group).num_rows
        low, high = max(start, first), min(stop, first + rows)
        if low < high:
            done = 0
            batches = handle.iter_batches(batch_size=BATCH, row_groups=[group],
                                          columns=[source.column], use_threads=False)
            while True:
                try:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    a, b = max(low - first - done, 0), min(high - first - done, batch.num_rows)
                    texts = text_values(batch.column(0).slice(a, b - a)) if a < b else []
                except (OSError, pa.ArrowException) as err:
                    raise parquet_damaged(source.path, group, err) from None
                yield from texts
                done += batch.num_rows
                if progress:
                    progress(min(1.0, (first + done - start) / max(stop - start, 1)))
        first += rows
        if first >= stop:
            return


def documents(source: InputFile, start: int = 0, stop: int | None = None,
              progress: Progress | None = None) -> Iterator[str | None]:
    """The documents of one range of one input, in order (None: a missing or null field)."""
    if source.fmt == "parquet":
        yield from _parquet_documents(source, start, source.units if stop is None else stop,
                                      progress)
        return
    stop = source.units if stop is None else stop
    raw, stream = _opened(source.path, source.compression)
    with raw:
        if start > 0:
            raw.seek(start - 1)
        yield from _stream_documents(source, stream, start, stop if source.units > 1 else None,
                                     progress, raw)


def positioned_documents(source: InputFile) -> Iterator[tuple[int, str | None]]:
    """(unit, document) of a whole input: the byte a line starts at, a Parquet row, 0 for a
    file read as one stream; the units a plan's pieces count (`data_prep/shards.py`)."""
    if source.fmt == "parquet":
        yield from enumerate(documents(source))
        return
    if not source.splittable:
        yield from ((0, text) for text in documents(source))
        return
    with open(source.path, "rb") as stream:
        lines = _lines(stream, 0, None, False)
        if source.fmt == "json":
            for offset, line in lines:
                if line.strip():
                    row = _json_row(line, source.path, offset)
                    yield offset, _json_text(row, source.column, source.path, f"byte {offset}")
        else:
            for offset, line in lines:
                yield from ((offset, text) for text in _line_documents(line, source.path, offset))


def _whole_text(stream: BinaryIO, path: str) -> str:
    """A text file read as one document, newlines made universal."""
    data, start = without_bom(b"".join(iter(lambda: stream.read(CHUNK), b"")), 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, start) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _stream_documents(source: InputFile, stream: BinaryIO, start: int, stop: int | None,
                      progress: Progress | None, raw: BinaryIO) -> Iterator[str | None]:
    if source.array:
        yield from _array_documents(stream, source.column, source.path)
    elif source.fmt == "text" and source.sample_by == "document":
        yield _whole_text(stream, source.path)
    elif source.fmt == "text" and source.sample_by == "paragraph":
        yield from _paragraphs(stream, source.path)
    else:
        lines = _lines(stream, max(start - 1, 0), stop, start > 0)
        if source.fmt == "json":
            found = _json_documents(lines, source.column, source.path)
        else:
            found = (d for offset, line in lines
                     for d in _line_documents(line, source.path, offset))
        span = (stop or source.size) - start
        for count, document in enumerate(found):
            yield document
            if progress and count % BATCH == BATCH - 1:
                progress(min(1.0, (raw.tell() - start) / max(span, 1)))
    if progress:
        progress(1.0)


# ----------------------------------------------------------------------------- pre-flight


def _head(source: InputFile) -> tuple[list[Any], bool]:
    """The first documents (as parsed rows for JSON) within HEAD_BYTES, and whether that was
    the whole file."""
    raw, stream = _opened(source.path, source.compression)
    with raw:
        if source.array:
            return _array_rows(stream, source.path), True
        if source.fmt == "json":
            rows, read = [], 0
            for offset, line in _lines(stream, 0, None, False):
                read = offset + len(line) + 1
                if line.strip():
                    rows.append(_json_row(line, source.path, offset))
                if read >= HEAD_BYTES:
                    return rows, False
            return rows, True
    texts = []
    for text in documents(source):
        texts.append(text)
        if sum(len(t or "") for t in texts) >= HEAD_BYTES:
            return texts, False
    return texts, True


def _starts_with_array(path: str, compression: str | None) -> bool:
    raw, stream = _opened(path, compression)
    with raw:
        return without_bom(stream.read(4096), 0)[0].lstrip()[:1] == b"["


def inspect(path: Path, fmt: str, compression: str | None, text_field: str,
            sample_by: str) -> InputFile:
    """The input as a task reads it, after a bounded look at its head (one-line errors)."""
    size = path.stat().st_size
    if fmt == "parquet":
        return _inspect_parquet(path, text_field, size)
    column = "text" if fmt == "text" else text_field
    try:  # a damaged compressed file fails in either read: InputError, one line
        array = fmt == "json" and _starts_with_array(str(path), compression)
        whole = compression or array or (fmt == "text" and sample_by != "line")
        source = InputFile(str(path), fmt, compression, column, sample_by, size,
                           1 if whole else size, array)
        head, complete = _head(source)
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as err:
        raise ConfigError(f"input file {path} cannot be read as {FORMAT_NAMES[fmt]} "
                          f"({type(err).__name__}: {err}); fix the file or remove it from "
                          "input=") from None
    if fmt == "json":
        _check_rows(path, head, text_field, "JSON" if array else "JSON lines")
        texts = [row.get(text_field) for row in head if isinstance(row, dict)]
    else:
        texts = head
    if complete:
        _check_not_empty(path, texts, fmt)
    return source


def _check_rows(path: Path, rows: list[Any], column: str, form: str = "JSON lines") -> None:
    """The field exists in the rows read (JSON lines, or the items of one JSON array) and
    holds text (the first value that is not null)."""
    types: dict[str, str] = {}
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"input file {path} cannot be read as {form} (row {index} "
                              f"is {_json_type(row)}, not an object); fix the file or remove "
                              "it from input=")
        for key, value in row.items():
            if value is not None and key not in types:
                types[key] = "string" if isinstance(value, str) else _json_type(value)
            types.setdefault(key, "null")
    check_field(path, column, types)


def check_field(path: Path, column: str, types: dict[str, str]) -> None:
    """`types`: field -> its type name ("string" or "large_string" for text), in file order."""
    texts = [f for f, t in types.items() if t in ("string", "large_string")]
    if column not in types:
        near = difflib.get_close_matches(column, list(types), n=1, cutoff=0.5)
        hint = near[0] if near and near[0] in texts else (texts[0] if texts else None)
        fix = f"set text_field={hint}" if hint else "give files with a text field"
        raise ConfigError(f"input file {path} has no field '{column}'; its fields are "
                          f"{', '.join(types) or 'none'}; {fix}")
    if types[column] not in ("string", "large_string", "null"):
        fix = f"text fields: {', '.join(texts)}" if texts else "the file has no text field"
        raise ConfigError(f"input file {path}: field '{column}' holds {types[column]}, not "
                          f"text; set text_field to a text field ({fix})")


def _check_not_empty(path: Path, texts: list[Any], fmt: str) -> None:
    if not any(t and not t.isspace() for t in texts):
        what = "lines" if fmt == "text" and len(texts) > 1 else "documents"
        raise ConfigError(f"input file {path} has no text: all {len(texts)} {what} are "
                          "empty; remove it from input=")


def _inspect_parquet(path: Path, column: str, size: int) -> InputFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(str(path))
    except (OSError, pa.ArrowException) as err:
        raise ConfigError(f"input file {path} cannot be read as Parquet ({type(err).__name__}: "
                          f"{str(err).splitlines()[0]}); fix the file or remove it from "
                          "input=") from None
    schema = handle.schema_arrow
    check_field(path, column, {f.name: "string" if is_text_type(f.type) else str(f.type)
                               for f in schema})
    rows = handle.metadata.num_rows
    source = InputFile(str(path), "parquet", None, column, "line", size, rows)
    if rows <= BATCH:
        _check_not_empty(path, list(documents(source)), "parquet")
    return source

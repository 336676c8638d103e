"""What `scripts/prepare_data.py` is asked to do, checked before any heavy import.

`PrepareConfig` is the whole request (torch-free, like the run schema). The command line is a
list of `key=value` words; `recipes.config.overrides` is written around `RunConfig` (its key
lists, suggestions and OmegaConf merge all name that root), so this module keeps its own small
typed parser with the same one-line messages: an unknown key names the closest keys, a wrong
type names what the key expects, an empty value says what to give. The rules are pure functions
returning None or one line; the path checks (inputs, tokenizer path, output folder) read the
filesystem but import nothing heavy, so a mistake is refused in well under a second, before
datasets, tokenizers, torch or Megatron are loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import os
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import as_written, convert, split_argument
from recipes.config.dataset_files import TOKENIZER_FILE
from recipes.config.links import resolved

TRAIN_PREFIX = "train:"  # tokenizer=train:VOCAB trains a byte-level BPE on the corpus
MIN_TRAIN_VOCAB = 257  # 256 byte symbols + the end-of-document token
MAX_VOCAB = 2**31 - 1  # token ids are stored as int32 at most
# Input formats by file suffix -> the `datasets` packaged builder that reads them.
FORMATS = {
    ".txt": "text", ".text": "text", ".md": "text",
    ".jsonl": "json", ".json": "json", ".ndjson": "json",
    ".parquet": "parquet",
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # datasets decompresses these on the fly
REQUIRED = ("input", "output", "tokenizer")
EXAMPLES = {
    "input": "data/*.jsonl",
    "output": "data/corpus",
    "tokenizer": "train:32000",
    "text_field": "text",
    "num_proc": "4",
    "shard_size": "1000000",
    "eod_token": "'<|endoftext|>'",
    "pack_size": "4096",
    "pad_multiple": "4",
    "num_shards": "128",
    "valid_shards": "1",
    "test_shards": "1",
    "ray_address": "ray://head:10001",
}
# Names people type from habit (Megatron's preprocess_data flags, other tools): suggestions.
_HABITUAL_NAMES = {
    "inputs": "input", "data": "input", "files": "input", "data_files": "input",
    "output_prefix": "output", "out": "output", "prefix": "output",
    "tokenizer_path": "tokenizer", "tokenizer_model": "tokenizer", "vocab": "tokenizer",
    "vocab_size": "tokenizer", "json_keys": "text_field", "field": "text_field",
    "text_key": "text_field", "key": "text_field", "workers": "num_proc",
    "num_workers": "num_proc", "nproc": "num_proc", "processes": "num_proc",
    "shards": "num_shards", "partitions": "num_shards", "address": "ray_address",
    "eod": "eod_token", "eos_token": "eod_token", "append_eod": "eod_token",
}


@dataclass(kw_only=True)
class PrepareConfig:
    """One preparation: local text/JSONL/Parquet files -> Megatron Core indexed datasets."""

    input: str  # files, a directory or a glob (several joined by commas)
    output: str  # prefix: datasets <output>_<name>.bin/.idx, <output>.json, .tokenizer.json
    tokenizer: str  # tokenizer.json, a directory holding one, or train:VOCAB
    text_field: str = "text"  # JSONL/Parquet field holding the text (text files: the text)
    sample_by: Literal["line", "paragraph", "document"] = "line"  # text files: one document is
    num_proc: int = 1  # workers: shard tasks run at a time (local processes or Ray CPUs)
    shard_size: int | None = None  # documents per dataset; None = one dataset per input file
    # Train shards of about equal tokens, cut in document order over all inputs; None = one
    # shard per input file (then shard_size may cut each further).
    num_shards: int | None = None
    # Held-out shards: a document goes to valid when the CRC-32 of its text modulo
    # round(1/held_out_fraction) is the largest residue, to test when it is the one below.
    valid_shards: int = 0
    test_shards: int = 0
    held_out_fraction: float = 0.01  # share of documents for valid (and again for test)
    executor: Literal["local", "ray"] = "local"  # a process pool here, or one Ray task a shard
    ray_address: str | None = None  # executor=ray: the cluster (else RAY_ADDRESS, else local)
    # Empty documents: written as zero-length documents (Megatron-LM's preprocess_data), or
    # left out of the index ("skip"). Either way they hold no tokens.
    empty_documents: Literal["keep", "skip"] = "keep"
    eod_token: str | None = None  # end-of-document token; None = the tokenizer's own
    seed: int = 1234  # seeds the packing index's shuffled pack order
    pack_size: int | None = None  # packing.seq_length: also write a pack index for such rows
    pad_multiple: int = 1  # packing.pad_multiple: pad each document in it (CP: 2 x CP)
    # The key each field was typed as (`parse_args`), so a message echoes what the user wrote;
    # a field missing here is named by its own name (a library caller's spelling).
    typed_keys: dict[str, str] = dataclasses.field(default_factory=dict, repr=False,
                                                   compare=False)

    @property
    def train_vocab(self) -> int | None:
        """VOCAB of `tokenizer=train:VOCAB`, or None for a tokenizer loaded from a path."""
        if not self.tokenizer.startswith(TRAIN_PREFIX):
            return None
        text = self.tokenizer[len(TRAIN_PREFIX):]
        return int(text) if text.isdigit() else None


# ----------------------------------------------------------------------------- parsing


_NOT_ARGUMENTS = ("typed_keys",)  # fields that are no key=value argument
# The documented (README, --help, docs/data.md) spelling of a field, where it differs from the
# field's name; the field's name is accepted too, as an older spelling of the same setting.
DOCUMENTED_KEYS = {"pack_size": "packing.seq_length", "pad_multiple": "packing.pad_multiple"}
KEY_ALIASES = {key: name for name, key in DOCUMENTED_KEYS.items()}  # spelling -> field


def field_types() -> dict[str, Any]:
    """Field name -> type, for every field a `key=value` argument sets."""
    hints = typing.get_type_hints(PrepareConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(PrepareConfig)
            if f.name not in _NOT_ARGUMENTS}


def documented_keys() -> list[str]:
    """The keys as the help and docs spell them, in field order (what messages list)."""
    return [DOCUMENTED_KEYS.get(name, name) for name in field_types()]


def closest_keys(key: str) -> list[str]:
    """Up to three documented keys near `key`, matched against every accepted spelling."""
    spellings = {**{name: DOCUMENTED_KEYS.get(name, name) for name in field_types()},
                 **{alias: alias for alias in KEY_ALIASES}}
    near = [_HABITUAL_NAMES[key]] if key in _HABITUAL_NAMES else []
    near += [k for k in spellings if len(key) > 2 and (k.startswith(key) or key.startswith(k))]
    near += difflib.get_close_matches(key, list(spellings), n=3, cutoff=0.6)
    return list(dict.fromkeys(spellings.get(k, k) for k in near))[:3]


def key_name(cfg: PrepareConfig, name: str) -> str:
    """How a message names field `name` when it echoes its value: the key the user typed
    (a value to give instead is suggested in the documented spelling)."""
    return cfg.typed_keys.get(name, name)


def _unknown_key_message(key: str) -> str:
    near = closest_keys(key)
    keys = ", ".join(documented_keys())
    hint = f"did you mean {', '.join(near)}?" if near else f"the keys are {keys}"
    return f"unknown key '{key}'; {hint}"


def _example(key: str) -> str:
    if key in EXAMPLES:
        return EXAMPLES[key]
    default = next(f.default for f in dataclasses.fields(PrepareConfig) if f.name == key)
    return as_written(default)


def parse_args(argv: Sequence[str]) -> PrepareConfig:
    """`key=value` words -> `PrepareConfig` (a later word wins over an earlier one of the same
    spelling, as an appended override does; one field under both of its spellings is refused)."""
    types_by_key = field_types()
    values: dict[str, Any] = {}
    typed: dict[str, str] = {}
    for text in argv:
        key, value = split_argument(text, "input=data/train.jsonl (quote a glob: "
                                    "input='data/*.jsonl')")
        name = KEY_ALIASES.get(key, key)
        if name not in types_by_key:
            raise ConfigError(_unknown_key_message(key))
        example = f"{key}={_example(name)}"
        if not value.strip():
            raise ConfigError(f"{key} is empty; give it a value, e.g. {example}")
        if name in typed and typed[name] != key:  # one field under two spellings
            raise ConfigError(f"{typed[name]}= and {key}= set the same field; keep one")
        values[name] = convert(key, value, types_by_key[name], example)
        typed[name] = key
    missing = [key for key in REQUIRED if key not in values]
    if missing:
        given = ", ".join(f"{key}={_example(key)}" for key in missing)
        raise ConfigError(f"missing {', '.join(missing)}; give {given} (--help shows the usage)")
    return PrepareConfig(**values, typed_keys=typed)


# ----------------------------------------------------------------------------- pure rules


def check_empty_text(cfg: PrepareConfig) -> str | None:
    """Text fields that name nothing (a library caller can pass '')."""
    for key in ("input", "output", "tokenizer", "text_field", "eod_token"):
        value = getattr(cfg, key)
        if isinstance(value, str) and not value.strip():
            return f"{key}='{value}' is empty; give it a value, e.g. {key}={_example(key)}"


def check_counts(cfg: PrepareConfig) -> str | None:
    if cfg.num_proc < 1:
        return f"num_proc={cfg.num_proc} must be at least 1, e.g. num_proc={os.cpu_count() or 1}"
    rows = key_name(cfg, "pack_size")
    if cfg.pack_size is not None and cfg.pack_size < 2:
        return (
            f"{rows}={cfg.pack_size} cannot hold a document and its next token; give rows of "
            "at least 2 tokens, e.g. packing.seq_length=4096, or leave it unset"
        )
    for key in ("num_shards", "valid_shards", "test_shards"):
        value = getattr(cfg, key)
        least = 1 if key == "num_shards" else 0
        if value is not None and value < least:
            return f"{key}={value} must be at least {least}, e.g. {key}={EXAMPLES[key]}"
    if cfg.shard_size is not None and cfg.num_shards is not None:
        return (f"shard_size={cfg.shard_size} and num_shards={cfg.num_shards} both cut the "
                "datasets; give one of them")
    if cfg.shard_size is not None and cfg.shard_size < 1:
        return (
            f"shard_size={cfg.shard_size} must be at least 1 document, or shard_size=null for "
            "one dataset per input file"
        )


def check_held_out(cfg: PrepareConfig) -> str | None:
    fraction = cfg.held_out_fraction
    if not 0 < fraction <= 1 / 3:
        return (f"held_out_fraction={fraction} must be in (0, 1/3] (the share of documents "
                "for valid, and again for test), e.g. held_out_fraction=0.01")


def check_executor(cfg: PrepareConfig) -> str | None:
    if cfg.ray_address is not None and cfg.executor != "ray":
        return (f"ray_address={cfg.ray_address} is used by executor=ray only; add executor=ray "
                "or leave ray_address unset")
    return ray_address_problem("ray_address", cfg.ray_address)


def ray_head(address: str) -> tuple[str, str, int] | None:
    """(kind, host, port) of a Ray address that names a head: `client` for Ray Client's
    `ray://HOST:PORT`, `gcs` for the head's GCS `HOST:PORT` (host without IPv6 brackets); None
    for any other text (`auto`, `local`, or one Ray cannot take)."""
    kind = "client" if address.startswith("ray://") else "gcs"
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if colon and host and "/" not in host and port.isdigit() and 0 < int(port) < 65536:
        return kind, host.strip("[]"), int(port)
    return None


def ray_address_problem(key: str, address: str | None) -> str | None:
    """`address` is one Ray takes (`auto`, `local`, `ray://HOST:PORT` for Ray Client,
    `HOST:PORT` for a head's GCS): anything else ended in Ray's ValueError traceback."""
    if address is None or address in ("auto", "local") or ray_head(address):
        return None
    return (f"{key}={address} is not a Ray address; give ray://HOST:PORT (Ray Client, e.g. "
            "ray://head:10001), HOST:PORT (the head's GCS, e.g. head:6379) or auto")


def check_pad_multiple(cfg: PrepareConfig) -> str | None:
    """A run with context parallel size CP trains on packs whose documents are padded to a
    multiple of 2 x CP; its rows (`packing.seq_length`) are then a multiple of 2 x CP too."""
    multiple, size = cfg.pad_multiple, cfg.pack_size
    pad, rows = key_name(cfg, "pad_multiple"), key_name(cfg, "pack_size")
    if multiple < 1:
        return (
            f"{pad}={multiple} must be at least 1 (1: no padding; for context parallel "
            "2 x CP, e.g. packing.pad_multiple=4 for CP2)"
        )
    if multiple > 1 and size is None:
        return (
            f"{pad}={multiple} pads documents in a packing index, but none is written; "
            f"also give packing.seq_length=<row length>, or leave {pad} unset"
        )
    if multiple > 1 and size % multiple:
        fits = size - size % multiple or multiple
        return (
            f"{rows}={size} is not a multiple of {pad}={multiple} (context parallel "
            f"cuts every row into 2 x CP chunks); give e.g. packing.seq_length={fits}"
        )


def check_train_vocab(cfg: PrepareConfig) -> str | None:
    """`train:VOCAB` needs a whole number that holds the 256 bytes and the end-of-document."""
    if not cfg.tokenizer.startswith(TRAIN_PREFIX):
        return None
    vocab = cfg.train_vocab
    if vocab is None:
        return (
            f"tokenizer={cfg.tokenizer}: VOCAB must be a whole number of tokens, "
            "e.g. tokenizer=train:32000"
        )
    if not MIN_TRAIN_VOCAB <= vocab <= MAX_VOCAB:
        return (
            f"tokenizer={cfg.tokenizer}: a byte-level BPE needs {MIN_TRAIN_VOCAB} to "
            f"{MAX_VOCAB} tokens (256 bytes + end-of-document at least), e.g. train:32000"
        )


def check_output_prefix(cfg: PrepareConfig) -> str | None:
    """`output` names files (`<output>_<name>.bin` ...), so it cannot end in a folder mark."""
    name = Path(cfg.output).name
    if cfg.output.endswith(("/", os.sep)) or name in ("", ".", ".."):
        return (
            f"output={cfg.output} is a folder, not a file prefix; name the files, "
            f"e.g. output={os.path.join(cfg.output, 'corpus')}"
        )


def check_text_field(cfg: PrepareConfig) -> str | None:
    if cfg.text_field != cfg.text_field.strip():
        return f"text_field='{cfg.text_field}' has spaces around it; e.g. text_field=text"


RULES: tuple[Callable[[PrepareConfig], str | None], ...] = (
    check_empty_text, check_counts, check_held_out, check_executor, check_pad_multiple,
    check_train_vocab, check_output_prefix, check_text_field,
)


# ----------------------------------------------------------------------------- path checks


def input_format(path: Path) -> str | None:
    """The datasets builder for a file ('text', 'json', 'parquet'), or None if not a corpus."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return FORMATS.get(suffixes[-1]) if suffixes else None


def _known_suffixes() -> str:
    return ", ".join(FORMATS)


# What a preparation writes besides its datasets, by role: the one place they are named.
OUTPUTS = {"manifest": ".json", "tokenizer": ".tokenizer", "records": ".shards",
           "data_args": ".data-args", "per_split_args": ".per-split-data-args.json"}
OUTPUT_SUFFIXES = tuple(OUTPUTS.values())
FOLDER_OUTPUTS = ("tokenizer", "records")  # the roles that are folders


def output_path(output: str | Path, role: str) -> Path:
    """`<output><suffix>` of one role of `OUTPUTS` (e.g. "manifest": `<output>.json`)."""
    prefix = Path(output).expanduser()
    return prefix.with_name(prefix.name + OUTPUTS[role])


def work_path(output: str | Path) -> Path:
    """The hidden work folder beside the output (same filesystem, so publishing is a rename)."""
    prefix = Path(output).expanduser()
    return prefix.with_name(f".{prefix.name}.work")


def output_files(output: str) -> tuple[Path, ...]:
    """The files and folders a preparation writes besides its datasets (a folder input must
    not read them back): the manifest, the tokenizer folder, the shard records, Megatron-LM's
    blend files."""
    return tuple(output_path(output, role) for role in OUTPUTS)


def _written(path: Path, skip: frozenset[Path]) -> bool:
    real = resolved(path)
    return real in skip or any(parent in skip for parent in real.parents)


def _visible_files(folder: Path, part: str) -> list[Path]:
    """Every file under `folder` outside hidden folders and not hidden itself. A folder this
    user may not read is refused: Path.rglob passes it over without a word, and its files would
    be left out of the corpus."""
    found: list[Path] = []
    closed: list[OSError] = []
    for root, folders, names in os.walk(folder, onerror=closed.append):
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [Path(root) / name for name in names if not name.startswith(".")]
    if closed:
        raise ConfigError(f"input={part}: the folder {closed[0].filename} is closed to this user "
                          f"({closed[0].strerror}), so its files would be left out; open it to "
                          "this user, or give another input")
    return found


def _expand(part: str, skip: frozenset[Path]) -> list[Path]:
    """One comma-separated piece of `input`: a file, a directory (recursive) or a glob;
    a folder or glob leaves out the files in `skip` (this run's own outputs)."""
    path = Path(part).expanduser()
    if glob.has_magic(part):
        matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        files = [p for p in matches if p.is_file() and not _written(p, skip)]
        if not files:
            raise ConfigError(f"input={part} matches no files; check the pattern or the folder")
        return files
    if path.is_dir():
        files = sorted(p for p in _visible_files(path, part)
                       if p.is_file() and input_format(p) and not _written(p, skip))
        if not files:
            raise ConfigError(
                f"input={part} is a folder with no corpus files; it needs files ending in "
                f"{_known_suffixes()}"
            )
        return files
    if not path.exists():
        raise ConfigError(f"input={part} does not exist; give files, a folder or a glob")
    return [path]


def resolve_inputs(spec: str, output: str | None = None) -> list[Path]:
    """Every input file `input=` names, in order (sorted within a folder or glob), each
    checked to be a non-empty file of a known format and not one `output` would write."""
    written = frozenset(resolved(p) for p in output_files(output)) if output else frozenset()
    files: list[Path] = []
    for part in (p.strip() for p in spec.split(",")):
        if part:
            files += _expand(part, written)
    if not files:
        raise ConfigError(f"input={spec} names no files; e.g. input={EXAMPLES['input']}")
    for path in files:
        if _written(path, written):
            raise ConfigError(
                f"input file {path} is a file this run writes (output={output}); "
                "choose another output or leave the file out of input="
            )
        if input_format(path) is None:
            raise ConfigError(
                f"input file {path} has an unknown format ('{path.suffix}'); corpus files end in "
                f"{_known_suffixes()} (optionally compressed: {', '.join(COMPRESSIONS)})"
            )
        if path.stat().st_size == 0:
            raise ConfigError(f"input file {path} is empty (0 bytes); remove it from input=")
    return list(dict.fromkeys(files))


def shard_names(files: Sequence[Path]) -> list[str]:
    """One dataset name per input file: its path below the files' common folder, without
    the suffixes, '/' -> '_' (`a/part-0.jsonl`, `b/part-0.jsonl` -> a_part-0, b_part-0), so
    independent jobs on different files of one corpus never collide."""
    real = [resolved(p) for p in files]
    root = Path(os.path.commonpath([p.parent for p in real]))
    names = []
    for path in real:
        relative = path.relative_to(root)
        stem = relative.name.split(".")[0] or relative.stem
        text = "_".join([*relative.parent.parts, stem])
        names.append(re.sub(r"[^A-Za-z0-9._-]+", "_", text))
    counts = {name: names.count(name) for name in names}
    return [f"{n}_{i:05d}" if counts[n] > 1 else n for i, n in enumerate(names)]


def check_tokenizer_path(cfg: PrepareConfig) -> str | None:
    """A tokenizer given by path must be a file or a folder holding tokenizer.json."""
    if cfg.tokenizer.startswith(TRAIN_PREFIX):
        return None
    expected = (
        "give a tokenizer.json file, a Hugging Face tokenizer folder holding tokenizer.json, "
        "or train:VOCAB (e.g. tokenizer=train:32000)"
    )
    path = Path(cfg.tokenizer).expanduser()
    if not path.exists():
        return f"tokenizer={cfg.tokenizer} does not exist; {expected}"
    if path.is_dir() and not (path / TOKENIZER_FILE).is_file():
        held = ", ".join(sorted(p.name for p in path.iterdir())[:5]) or "nothing"
        return (
            f"tokenizer={cfg.tokenizer} is a folder without {TOKENIZER_FILE} (it holds {held}); "
            f"{expected}"
        )
    return None


def check_output_dir(cfg: PrepareConfig) -> str | None:
    """The output's folder must exist (or be creatable) and be writable; the prefix itself
    must not be a folder."""
    prefix = Path(cfg.output).expanduser()
    if prefix.is_dir():
        return (
            f"output={cfg.output} is a folder; give a file prefix inside it, "
            f"e.g. output={prefix / 'corpus'}"
        )
    folder = prefix.parent
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        return (
            f"output={cfg.output}: its folder cannot be created because {existing} is a file; "
            "choose another output prefix"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"output={cfg.output}: the folder {existing} is not writable; choose another output"
    return None


PATH_CHECKS: tuple[Callable[[PrepareConfig], str | None], ...] = (
    check_tokenizer_path, check_output_dir,
)


def validate(cfg: PrepareConfig) -> list[Path]:
    """Run the pure rules, then the path checks; return the input files. Raises `ConfigError`
    with the first message."""
    for rule in (*RULES, *PATH_CHECKS):
        message = rule(cfg)
        if message:
            raise ConfigError(message)
    files = resolve_inputs(cfg.input, cfg.output)
    message = option_without_its_format(cfg, files)
    if message:
        raise ConfigError(message)
    return files


def option_without_its_format(cfg: PrepareConfig, files: Sequence[Path]) -> str | None:
    """An option typed for one kind of input where no input is of that kind, which would be
    ignored: `text_field=` reads JSONL and Parquet records, `sample_by=` splits text files."""
    formats = {input_format(path) for path in files}
    if "text_field" in cfg.typed_keys and not formats & {"json", "parquet"}:
        key = key_name(cfg, "text_field")
        return (f"{key}={cfg.text_field} names a field of JSONL or Parquet records, but every "
                "input is a text file (its lines or paragraphs are the text): drop "
                f"{key}=")
    if "sample_by" in cfg.typed_keys and "text" not in formats:
        return (f"sample_by={cfg.sample_by} splits text files into documents, but every input "
                "is JSONL or Parquet (a record is a document): drop sample_by=")
    return None

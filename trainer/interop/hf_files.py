"""Reading a Hugging Face model directory shard by shard, and writing one atomically.

Why: published models are tens of gigabytes in several `safetensors` shards. Reading goes through
`safetensors.safe_open` (memory-mapped; a tensor is read when asked for), one shard open at a time
in file order, and every name, shard and shape is checked from the shards' headers before any
output exists, so a missing shard or tensor is refused in one line, not after minutes of work,
and so is a shard safetensors cannot read (a download cut short, a header overwritten), which
would otherwise end in a `SafetensorError` traceback. A tensor stored in a dtype that is not a
floating point one (an integer re-save) is refused from the header too: it would import and
train as numbers no model holds. The JSON side files are parsed before any work, since a
damaged tokenizer.json would be copied into the import and exported broken; a directory with
no tokenizer file at all is said in one note (`no_tokenizer_note`), not refused.
Writing fills size-limited shards as tensors arrive and publishes the directory by one rename:
a crash leaves only a `.tmp-` directory, never something that looks like a complete model.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from plugins.protocol.errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Files of a model directory that are not weights and travel with it (tokenizer, generation).
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "generation_config.json")
JSON_SIDE_FILES = tuple(name for name in SIDE_FILES if name.endswith(".json"))
TOKENIZER_FILES = tuple(name for name in SIDE_FILES if name != "generation_config.json")
DEFAULT_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def damaged_shard(path: Path, error: Exception) -> str:
    """The line for a shard safetensors cannot read: cut short (`incomplete metadata, file not
    fully covered`), its header overwritten (`invalid UTF-8 in header`, `HeaderTooLarge`)."""
    return f"{path} is truncated or damaged ({error}); download the model again"


def not_floating(name: str, dtype: str) -> str | None:
    """The line for a tensor stored in a safetensors dtype that is not one of the floating point
    ones read as weights (`I32`, `U8`, `BOOL`: a re-save that cast it); None for those."""
    if dtype in SAFETENSORS_BYTES:
        return None
    return (f"hf tensor {name} is stored as {dtype}, not a floating point dtype "
            f"({', '.join(SAFETENSORS_BYTES)}); the weights are not the model's: re-download it")


def unreadable_shard(path: Path, error: OSError) -> str:
    """The line for a shard (or side file) that cannot be opened: a link whose target is gone
    (the hub cache links each snapshot file to a blob; a download cut short or a cleaned cache
    leaves the link alone), or what the system said."""
    if path.is_symlink() and not path.exists():
        return (f"{path} links to {os.readlink(path)}, which does not exist (a download cut "
                "short, or a cleaned cache); download the model again")
    if error.strerror is None:  # safetensors' own, FileNotFoundError for any: ask the system
        try:
            with open(path, "rb"):
                pass
        except OSError as system:
            error = system
    return f"{path} cannot be read ({error.strerror or type(error).__name__}); fix its permissions"


def open_shard(path: Path):
    """`safe_open` of one shard, opened; a damaged one is one line (`damaged_shard`), one that
    cannot be opened too (`unreadable_shard`)."""
    try:
        return safe_open(path, framework="pt").__enter__()
    except SafetensorError as error:
        raise ConfigError(damaged_shard(path, error)) from None
    except OSError as error:
        raise ConfigError(unreadable_shard(path, error)) from None


def _weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index or from the shards' own headers."""
    index = model_dir / INDEX
    if index.is_file():
        try:
            return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"{index} is not a safetensors index ({error}); re-download "
                              "the model") from None
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not shards:
        raise ConfigError(f"hf={model_dir} holds no *.safetensors weights (only safetensors are "
                          "read); download the model's safetensors files")
    found = {}
    for shard in shards:
        handle = open_shard(model_dir / shard)
        found.update({name: shard for name in handle.keys()})
        handle.__exit__(None, None, None)
    return found


class HFWeights:
    """The tensors of one model directory, read one shard at a time."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        self.weight_map = _weight_map(self.dir)
        missing = sorted({s for s in self.weight_map.values() if not (self.dir / s).is_file()})
        if missing:
            raise ConfigError(f"hf={self.dir}: shard {missing[0]} named by {INDEX} is missing "
                              f"({len(missing)} missing in all); re-download the model")
        self._open: tuple[str, object] | None = None

    def shard_of(self, name: str) -> str:
        if name not in self.weight_map:
            raise ConfigError(f"hf={self.dir} lacks tensor {name}; the model is not the "
                              "architecture its config.json names, or a download is incomplete")
        return self.weight_map[name]

    def _handle(self, shard: str):
        if self._open is None or self._open[0] != shard:
            self.close()
            self._open = (shard, open_shard(self.dir / shard))
        return self._open[1]

    def shape(self, name: str) -> tuple[int, ...]:
        """From the shard's header only (no data read)."""
        return tuple(self._handle(self.shard_of(name)).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The stored safetensors dtype (`BF16`, `I32`), from the shard's header only."""
        return self._handle(self.shard_of(name)).get_slice(name).get_dtype()

    def element_bytes(self, name: str) -> int:
        """Bytes per element of a stored tensor, from the shard's header only."""
        return SAFETENSORS_BYTES[self._handle(self.shard_of(name)).get_slice(name).get_dtype()]

    def get(self, name: str) -> torch.Tensor:
        shard = self.shard_of(name)
        try:
            return self._handle(shard).get_tensor(name)
        except SafetensorError as error:  # a header whose offsets the file does not hold
            raise ConfigError(damaged_shard(self.dir / shard, error)) from None

    def close(self) -> None:
        if self._open is not None:
            self._open[1].__exit__(None, None, None)
            self._open = None

    def shard_paths(self) -> list[Path]:
        return [self.dir / shard for shard in sorted(set(self.weight_map.values()))]


def side_files(model_dir: Path) -> list[Path]:
    """The side files present in `model_dir`; one linking to a blob that is gone is refused
    (`unreadable_shard`'s line), not left behind without a word."""
    found = []
    for name in SIDE_FILES:
        path = Path(model_dir) / name
        if path.is_symlink() and not path.exists():
            raise ConfigError(unreadable_shard(path, FileNotFoundError()))
        if path.is_file():
            found.append(path)
    return found


def not_json(path: Path) -> str | None:
    """The line for a JSON side file that does not parse (a download cut short, an edit gone
    wrong); None for one that does, and for a file that is not JSON (`tokenizer.model`)."""
    if path.name not in JSON_SIDE_FILES:
        return None
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError alike
        return f"{path} is not valid JSON ({error}); re-download it"
    except OSError as error:
        return unreadable_shard(path, error)
    return None


def no_tokenizer_note(model_dir: Path, side: list[Path]) -> str | None:
    """The note for a model directory holding none of the tokenizer files (only its weights
    and config were copied); None where it holds one."""
    if any(path.name in TOKENIZER_FILES for path in side):
        return None
    return (f"note: hf={model_dir} has no tokenizer files; the import carries none (to keep the "
            "model's tokenizer, put its files beside config.json and import again)")


@dataclass(frozen=True)
class RunTokenizer:
    """The tokenizer a run's prepared data was made with, as its blend names it."""

    file: Path  # its tokenizer.json (older preparations: a `<output>.tokenizer.json` file)
    eod_token: str | None  # the end-of-document token the data ends documents with
    eod_id: int | None
    manifest: Path  # the manifest that names it


def run_tokenizer(blend_path: str | None) -> RunTokenizer | None:
    """The tokenizer a run trained with: from its blend's first manifest (prepare_data writes
    `<output>.tokenizer/` and names it there, with its end-of-document token), if any. Every
    manifest of a blend names the same tokenizer (recipes/config/blend.py refuses others)."""
    import yaml

    if not blend_path or not Path(blend_path).is_file():
        return None
    loaded = yaml.safe_load(Path(blend_path).read_text(encoding="utf-8")) or {}
    for entry in loaded.get("train") or []:
        manifest = Path(str(entry.get("manifest", ""))) if isinstance(entry, dict) else None
        if manifest is None or not manifest.is_file():
            continue
        facts = json.loads(manifest.read_text(encoding="utf-8"))
        tokenizer = manifest.parent / str(facts.get("tokenizer", ""))
        if tokenizer.is_dir():  # a Hugging Face folder (older preparations: one file)
            tokenizer = tokenizer / "tokenizer.json"
        if tokenizer.is_file():
            return RunTokenizer(tokenizer, facts.get("eod_token"), facts.get("eod_id"), manifest)
    return None


def write_tokenizer(tokenizer: Path, eod_token: str | None, directory: Path) -> None:
    """tokenizer.json and the tokenizer_config.json transformers needs to load it: its end of
    document is both EOS and PAD (the ids config.json carries, trainer/interop/token_ids.py),
    and a BOS token its own folder names stays."""
    shutil.copy2(tokenizer, directory / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if eod_token:
        config["eos_token"] = config["pad_token"] = eod_token
    own = tokenizer.parent / "tokenizer_config.json" if tokenizer.name == "tokenizer.json" \
        else None
    if own is not None and own.is_file():
        bos = json.loads(own.read_text(encoding="utf-8")).get("bos_token")
        if bos:
            config["bos_token"] = bos
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def same_mode(directory: Path) -> int:
    """Give every file in `directory` the mode a new file gets here (0666 less the umask):
    safetensors writes its files 0600, which other users of a shared model folder could not
    read while config.json beside them is world-readable. The mode given."""
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(mode)
    return mode


def refuse_existing(out: Path) -> None:
    if out.exists():
        raise ConfigError(f"out={out} already exists; choose a new directory or remove it")


def publish(tmp: Path, out: Path) -> None:
    """Make a finished temporary directory the output, by one rename."""
    refuse_existing(out)
    tmp.rename(out)


def temporary_dir(out: Path) -> Path:
    """An empty `<out>.tmp-<pid>` beside the output (same filesystem: the rename is atomic)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


class ShardWriter:
    """Writes tensors into `model-NNNNN-of-NNNNN.safetensors` shards of at most `max_bytes`."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.dir, self.max_bytes = directory, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[tuple[str, list[str]]] = []  # (temporary file name, tensor names)
        self.total_bytes = 0

    def add(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in items:
            size = tensor.numel() * tensor.element_size()
            if self.pending and self.pending_bytes + size > self.max_bytes:
                self._flush()
            self.pending[name] = tensor
            self.pending_bytes += size
            self.total_bytes += size

    def _flush(self) -> None:
        name = f"part-{len(self.written):05d}.safetensors"
        save_file(self.pending, self.dir / name, metadata={"format": "pt"})
        self.written.append((name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        """Final names, and the index when there is more than one shard."""
        if self.pending:
            self._flush()
        count = len(self.written)
        if count == 1:
            (self.dir / self.written[0][0]).rename(self.dir / SINGLE)
            return
        weight_map = {}
        for number, (temporary, names) in enumerate(self.written, start=1):
            final = f"model-{number:05d}-of-{count:05d}.safetensors"
            (self.dir / temporary).rename(self.dir / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.dir / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

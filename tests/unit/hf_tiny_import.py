"""One successful `scripts/convert.py import` of the tiny Llama, shared by the tests that read
what an import prints and writes (the session fixture `tiny_llama_import`,
tests/unit/conftest.py); each import costs a process start and a Megatron save, about 10 s.

Its input carries what each of those tests needs at once: a hub-cache snapshot (the digests its
download recorded are checked, test_hf_digests.py) of the model with an old `rotary_emb.inv_freq`
buffer and no tokenizer files (skipped and noted, test_hf_import_contents.py); the record it
writes is test_hf_import_manifest.py's. A test that damages the output damages a copy.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.dist.hf_runs import copy_model, make_hf_model
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
SHARD = "model.safetensors"
OLD_BUFFER = "model.rotary_emb.inv_freq"


def run_import(model: Path, out: Path) -> subprocess.CompletedProcess:
    """The script's import of `model` into `out` for the tiny Llama recipe."""
    return subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}", f"out={out}",
         "recipe=hf_tiny_llama"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)


def with_tensors(model: Path, to: Path, **changed) -> Path:
    """A copy whose shard holds `changed` (names with `__` for `.`) besides or instead."""
    from safetensors.torch import load_file, save_file

    copy = copy_model(model, to)
    tensors = load_file(copy / SHARD)
    tensors.update({name.replace("__", "."): t for name, t in changed.items()})
    save_file(tensors, copy / SHARD, metadata={"format": "pt"})
    return copy


def hub_cache(model: Path, root: Path) -> Path:
    """The model as the hub cache holds it: blobs named by SHA-256, a snapshot of links."""
    snapshot = root / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    for path in model.iterdir():
        data = path.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snapshot


@dataclass(frozen=True)
class Imported:
    model: Path  # the snapshot imported (hf=)
    out: Path  # the import (out=)
    done: subprocess.CompletedProcess


def import_once(base: Path) -> Imported:
    """The tiny Llama, with the old buffer, in a hub cache under `base`, imported there."""
    import torch

    buffered = with_tensors(make_hf_model("llama", base / "hf"), base / "buffered",
                            **{OLD_BUFFER.replace(".", "__"): torch.ones(8)})
    model = hub_cache(buffered, base / "cache")
    out = base / "out"
    return Imported(model, out, run_import(model, out))

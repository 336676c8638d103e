"""The SHA-256 a Hugging Face download recorded for each shard, checked before an import.

A byte changed inside a shard's tensor data (a flipped bit on disk, a copy cut and patched)
leaves the safetensors header intact: every other check of the import passes and the damage
would travel into the checkpoint unseen. Hugging Face records each large file's digest where
it downloads it: the hub cache names a file's blob by its SHA-256
(`snapshots/<revision>/<shard> -> ../../blobs/<sha256>`), and `hf download --local-dir` keeps
the same digest as the file's etag in `.cache/huggingface/download/<shard>.metadata` (its
second line). Where neither is there (a directory written by `save_pretrained`, our own
export), there is nothing to compare with and nothing is checked.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from plugins.protocol.errors import ConfigError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
METADATA = Path(".cache") / "huggingface" / "download"
CHUNK = 16 * 2**20


def recorded_sha256(shard: Path) -> str | None:
    """The digest the download recorded for `shard`: its cache blob's name, or the etag of a
    `--local-dir` download's metadata; None where it recorded none."""
    if shard.is_symlink():
        blob = Path(os.readlink(shard)).name
        if SHA256.match(blob):
            return blob
    metadata = shard.parent / METADATA / f"{shard.name}.metadata"
    try:
        lines = metadata.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
    return etag if SHA256.match(etag) else None


def file_sha256(path: Path, advance=lambda n: None) -> str:
    """SHA-256 of a file, read in chunks; `advance(bytes)` after each (a progress bar)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            advance(len(chunk))
    return digest.hexdigest()


def digest_problem(shard: Path, recorded: str, actual: str) -> str | None:
    """The line for a shard whose bytes are not the ones the download recorded, else None."""
    if actual == recorded:
        return None
    return (f"{shard} is damaged: its SHA-256 is {actual[:12]}..., the download recorded "
            f"{recorded[:12]}...; download it again (hf download <repo> {shard.name} "
            "--force-download)")


def check_digests(shards: Iterable[Path], progress=None) -> int:
    """Every shard with a recorded digest hashed and compared (a bar over their bytes when
    `progress`, a rich Progress, is given); the first mismatch is a ConfigError. Returns how
    many shards had a digest to compare with."""
    known = [(shard, digest) for shard in shards if (digest := recorded_sha256(shard))]
    if not known:
        return 0
    advance = _bar(progress, sum(shard.stat().st_size for shard, _ in known))
    for shard, recorded in known:
        problem = digest_problem(shard, recorded, file_sha256(shard, advance))
        if problem:
            raise ConfigError(problem)
    return len(known)


def _bar(progress, total: int):
    """`advance(bytes)` of a bar of `total` bytes on `progress`; does nothing without one."""
    if progress is None:
        return lambda n: None
    task = progress.add_task("sha-256", total=total)
    return lambda n: progress.advance(task, n)

"""A preparation onto a file system that fills up mid-write: one line naming the output and the
free space, the complete shards kept, nothing half-written named like a dataset, and the same
command finishing the job once there is room (`data_prep/shards.py`, the per-shard records).

The output is on a small tmpfs (root mounts it; skipped where that is not allowed) that holds two
of the four shards; then it is remounted larger. A word-level tokenizer keeps it fast (no BPE).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from data_prep.config import PrepareConfig
from data_prep.corpus import _SYNTHETIC_WORDS, synthetic_documents
from data_prep.prepare import prepare
from plugins.protocol.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning")
SHARDS = 4  # of about 250 kB of tokens each


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's `size=`, e.g. 640k) at the new folder `mount`, unmounted
    after: a file system that fills up. Skips the test where it cannot be mounted (not root,
    or no mounts allowed); tests/dist/test_full_disk.py fills one with a checkpoint."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small_disk", "640k") as mount:
        yield mount


def _inputs(folder):
    words = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *sorted(
        set(_SYNTHETIC_WORDS))])}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "words.json"))
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n"
                              for t in synthetic_documents(3_300_000, seed=5)))
    return corpus, folder / "words.json"


def _datasets(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.suffix in (".bin", ".idx")}


def test_a_full_disk_is_one_line_and_the_same_command_finishes(small_disk, tmp_path) -> None:
    corpus, tokenizer = _inputs(tmp_path)
    output = small_disk / "web"
    cfg = PrepareConfig(input=str(corpus), output=str(output), tokenizer=str(tokenizer),
                        num_shards=SHARDS)
    with pytest.raises(ConfigError) as error:
        prepare(cfg)
    message = str(error.value)
    assert message.startswith(f"output={output}: the file system is full (No space left on "
                              "device) writing web_train_0000"), message
    assert f"MiB free in {small_disk}; the unfinished shard was removed and the complete ones " \
        "are kept" in message and "\n" not in message
    kept = sorted(p.stem for p in (small_disk / "web.shards").glob("*.json"))
    assert 1 <= len(kept) < SHARDS
    assert sorted({p.stem for p in small_disk.iterdir() if p.suffix in (".bin", ".idx")}) == kept
    assert not list((small_disk / ".web.work").glob("*.bin"))  # the failed task's files are gone
    assert not (small_disk / "web.json").exists()  # no manifest: the preparation is unfinished
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    result = prepare(cfg)
    assert result.redone == SHARDS - len(kept)
    reference = prepare(PrepareConfig(input=str(corpus), output=str(tmp_path / "ref" / "web"),
                                      tokenizer=str(tokenizer), num_shards=SHARDS))
    assert _datasets(small_disk) == _datasets(tmp_path / "ref")
    assert result.tokens == reference.tokens and not (small_disk / ".web.work").exists()

"""A safetensors shard cut short, with its header overwritten or behind a link to nothing (a side
file behind one too) is one line naming the file, what safetensors (or the link) says and the
fix (download again), exit 2, before any output exists; not a `SafetensorError` or
`FileNotFoundError` traceback (`trainer/interop/hf_files.py`, `open_shard`, `side_files`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import copy_model, make_hf_model
from tests.hang import HANG_S
from tests.plain_user import plain_user_prefix
from trainer.interop.hf_files import HFWeights, damaged_shard, unreadable_shard
from trainer.interop.importer import check_source

REPO = Path(__file__).resolve().parents[2]
SHARD = "model.safetensors"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama")


def _truncated(model: Path, to: Path) -> Path:
    copy = copy_model(model, to)
    (copy / SHARD).write_bytes((copy / SHARD).read_bytes()[:300_000])
    return copy


def _header_overwritten(model: Path, to: Path) -> Path:
    copy = copy_model(model, to)
    data = bytearray((copy / SHARD).read_bytes())
    data[10:50] = b"\xff" * 40
    (copy / SHARD).write_bytes(bytes(data))
    return copy


def test_the_line_names_the_file_the_reason_and_the_fix() -> None:
    assert damaged_shard(Path("m/model.safetensors"), ValueError("cut")) == (
        "m/model.safetensors is truncated or damaged (cut); download the model again")


@pytest.mark.parametrize("damage, reason", [
    (_truncated, "incomplete metadata, file not fully covered"),
    (_header_overwritten, "invalid UTF-8 in header"),
])
def test_a_damaged_shard_is_named(llama, tmp_path, damage, reason) -> None:
    model = damage(llama, tmp_path / "model")
    with pytest.raises(ConfigError, match=re.escape(f"{model / SHARD} is truncated or damaged "
                                                    f"(Error while deserializing header: "
                                                    f"{reason}")) as caught:
        HFWeights(model)  # a single shard: its header is read for the names
    assert str(caught.value).endswith("; download the model again")
    assert "\n" not in str(caught.value)


def test_a_damaged_shard_behind_an_index_is_named(llama, tmp_path) -> None:
    """With an index the names come from it; the shard is first opened for the shapes."""
    model = _truncated(llama, tmp_path / "model")
    names = HFWeights(llama).weight_map
    index = {"weight_map": dict.fromkeys(names, SHARD)}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="is truncated or damaged"):
        check_source(model, get_recipe("hf_tiny_llama"))


def test_the_script_prints_one_line_exits_2_and_writes_nothing(llama, tmp_path) -> None:
    model = _truncated(llama, tmp_path / "model")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}", f"out={out}",
         "recipe=hf_tiny_llama"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(f"error: {model / SHARD} is truncated or damaged (")
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))


def test_a_shard_whose_cache_blob_is_gone_is_named(llama, tmp_path) -> None:
    """The hub cache links each snapshot file to a blob; a cleaned cache or a download cut
    short leaves the link alone: one line naming both, not a FileNotFoundError traceback."""
    model = copy_model(llama, tmp_path / "model")
    (model / SHARD).unlink()
    (model / SHARD).symlink_to("../blobs/0123abcd")
    with pytest.raises(ConfigError) as caught:
        HFWeights(model)
    assert str(caught.value) == (f"{model / SHARD} links to ../blobs/0123abcd, which does not "
                                 "exist (a download cut short, or a cleaned cache); download "
                                 "the model again")
    assert unreadable_shard(Path("m/x.safetensors"), PermissionError(13, "Permission denied")) \
        == "m/x.safetensors cannot be read (Permission denied); fix its permissions"


def test_a_shard_closed_to_this_user_is_said_as_the_system_says_it(tmp_path) -> None:
    """safetensors raises a FileNotFoundError without a reason for a file it may not open; the
    line asks the system instead (as root, with the capabilities that read through chmod
    dropped)."""
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(b"x")
    shard.chmod(0)
    code = ("import sys\nfrom pathlib import Path\n"
            "from trainer.interop.hf_files import unreadable_shard\n"
            "print(unreadable_shard(Path(sys.argv[1]), FileNotFoundError()))\n")
    done = subprocess.run([*plain_user_prefix(), sys.executable, "-c", code, str(shard)],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"{shard} cannot be read (Permission denied); fix its permissions\n"


def test_a_side_file_whose_cache_blob_is_gone_is_named(llama, tmp_path) -> None:
    """A tokenizer or generation config linking to nothing would be left out of the import
    without a word; it is refused by the checks that run before any output exists."""
    model = copy_model(llama, tmp_path / "model")
    (model / "generation_config.json").unlink(missing_ok=True)
    (model / "generation_config.json").symlink_to("../blobs/4567cdef")
    with pytest.raises(ConfigError) as caught:
        check_source(model, get_recipe("hf_tiny_llama"))
    assert str(caught.value) == (f"{model / 'generation_config.json'} links to ../blobs/4567cdef"
                                 ", which does not exist (a download cut short, or a cleaned "
                                 "cache); download the model again")

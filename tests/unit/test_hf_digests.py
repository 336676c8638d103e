"""A byte changed inside a shard's tensor data, which no safetensors header shows, is found by
the SHA-256 the download recorded (`trainer/interop/hf_digests.py`): the hub cache's blob name,
or the etag of a `--local-dir` download. Without a recorded digest nothing is compared."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from tests.dist.hf_runs import make_hf_model
from tests.unit.hf_tiny_import import hub_cache, run_import
from trainer.interop.hf_digests import (
    check_digests,
    digest_problem,
    file_sha256,
    recorded_sha256,
)

SHARD = "model.safetensors"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama")


def _local_dir(model: Path, root: Path) -> Path:
    """The model as `hf download --local-dir` leaves it: files, and their etags aside."""
    root.mkdir()
    metadata = root / ".cache" / "huggingface" / "download"
    metadata.mkdir(parents=True)
    for path in model.iterdir():
        data = path.read_bytes()
        (root / path.name).write_bytes(data)
        (metadata / f"{path.name}.metadata").write_text(
            f"0123abc\n{hashlib.sha256(data).hexdigest()}\n1733450000.0\n")
    return root


def _flip_a_tensor_byte(shard: Path) -> None:
    """One byte in the middle of the tensor data (the header, at the front, stays valid)."""
    target = shard.resolve()
    data = bytearray(target.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01
    target.write_bytes(bytes(data))


@pytest.mark.parametrize("layout", [hub_cache, _local_dir])
def test_the_recorded_digest_is_read_and_matches_an_intact_shard(llama, tmp_path, layout):
    model = layout(llama, tmp_path / "model")
    expected = hashlib.sha256((llama / SHARD).read_bytes()).hexdigest()
    assert recorded_sha256(model / SHARD) == expected
    assert check_digests([model / SHARD]) == 1


@pytest.mark.parametrize("layout", [hub_cache, _local_dir])
def test_a_byte_changed_inside_tensor_data_is_refused(llama, tmp_path, layout):
    model = layout(llama, tmp_path / "model")
    _flip_a_tensor_byte(model / SHARD)
    with pytest.raises(ConfigError, match=f"^{model / SHARD} is damaged: its SHA-256 is ") as e:
        check_digests([model / SHARD])
    assert str(e.value).endswith("--force-download)") and "\n" not in str(e.value)


def test_no_recorded_digest_means_nothing_to_compare(llama, tmp_path):
    """save_pretrained's directory (and our export) record none; an etag that is no SHA-256
    (a small file's git hash of 40 digits) is not taken for one."""
    assert recorded_sha256(llama / SHARD) is None and check_digests([llama / SHARD]) == 0
    model = _local_dir(llama, tmp_path / "model")
    meta = model / ".cache" / "huggingface" / "download" / f"{SHARD}.metadata"
    meta.write_text("0123abc\n" + "a" * 40 + "\n1733450000.0\n")
    assert recorded_sha256(model / SHARD) is None


def test_the_line_names_both_digests_and_the_fix():
    assert digest_problem(Path("m/x.safetensors"), "a" * 64, "a" * 64) is None
    assert digest_problem(Path("m/x.safetensors"), "a" * 64, "b" * 64) == (
        "m/x.safetensors is damaged: its SHA-256 is bbbbbbbbbbbb..., the download recorded "
        "aaaaaaaaaaaa...; download it again (hf download <repo> x.safetensors --force-download)")


def test_the_hash_is_read_in_chunks_and_reports_progress(tmp_path, monkeypatch):
    import trainer.interop.hf_digests as digests

    monkeypatch.setattr(digests, "CHUNK", 7)
    path = tmp_path / "f"
    path.write_bytes(bytes(range(20)))
    seen: list[int] = []
    assert file_sha256(path, seen.append) == hashlib.sha256(bytes(range(20))).hexdigest()
    assert seen == [7, 7, 6]


def test_the_import_checks_a_cached_model_and_says_so(tiny_llama_import):
    """The session's one import (tests/unit/conftest.py) is of a hub-cache snapshot."""
    assert recorded_sha256(tiny_llama_import.model / SHARD) is not None
    done = tiny_llama_import.done
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sha-256: 1 of 1 shards match the digests their download recorded" in done.stdout


def test_the_import_refuses_a_damaged_cached_shard_before_writing(llama, tmp_path):
    model = hub_cache(llama, tmp_path / "model")
    _flip_a_tensor_byte(model / SHARD)
    out = tmp_path / "out"
    done = run_import(model, out)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(f"error: {model / SHARD} is damaged: its SHA-256 is ")
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))

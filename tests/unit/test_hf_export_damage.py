"""`convert.py export` checks the step against its `run.json` before reading it, as pretrain.py
does (`trainer/interop/export_step.py`): a file missing, cut short or overwritten in place is
one line naming it and the step to export instead, exit 2, before torch is imported. The steps
here are written by hand (a file and its record through `manifest.file_record`): no run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from trainer.checkpoint.format import HF_IMPORT_SOURCE, IMPORT_CONFIG
from trainer.checkpoint.manifest import file_record
from trainer.interop.export_step import checked_step, checksums_wanted, damage_line, fallback

REPO = Path(__file__).resolve().parents[2]
SHARD = "__0_0.distcp"


def _step(root: Path, step: int, verify: str = "checksum") -> Path:
    """A published step: Megatron's marker, one shard and `run.json` recording them."""
    directory = root / f"step_{step:07d}"
    directory.mkdir(parents=True)
    (directory / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (directory / SHARD).write_bytes(bytes(range(256)) * 40)
    files = {p.name: file_record(p) for p in directory.iterdir()}
    manifest = {"step": step, "consumed_samples": 0, "consumed_tokens": 0, "versions": {},
                "config": {"checkpoint": {"verify": verify}}, "files": files}
    (directory / "run.json").write_text(json.dumps(manifest))
    (root / "latest").write_text(directory.name)
    return directory


def _overwrite(path: Path, at: int = 4000, size: int = 64) -> None:
    """Bytes changed in place: the size stays, only the CRC-32 tells."""
    data = bytearray(path.read_bytes())
    data[at:at + size] = bytes(size)
    path.write_bytes(bytes(data))


def test_an_intact_step_is_returned(tmp_path) -> None:
    step = _step(tmp_path / "checkpoints", 2)
    assert checked_step(tmp_path / "checkpoints") == step
    assert checked_step(step) == step


def test_a_truncated_file_is_named_with_the_previous_step(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    previous, step = _step(root, 1), _step(root, 2)
    (step / SHARD).write_bytes((step / SHARD).read_bytes()[:5000])
    with pytest.raises(ConfigError) as caught:
        checked_step(root)
    assert str(caught.value) == (
        f"checkpoint={root}: step_0000002/{SHARD} is truncated or changed (5000 of 10240 "
        f"bytes); export the previous complete checkpoint with checkpoint={previous} (or delete "
        f"{step}: the root then exports it)")


def test_a_missing_file_is_named(tmp_path) -> None:
    step = _step(tmp_path / "checkpoints", 2)
    (step / SHARD).unlink()
    with pytest.raises(ConfigError, match=f"step_0000002/{SHARD} is missing; no earlier"):
        checked_step(step)


def test_a_file_overwritten_in_place_is_named_by_its_crc(tmp_path) -> None:
    step = _step(tmp_path / "checkpoints", 2)
    _overwrite(step / SHARD)
    with pytest.raises(ConfigError, match=f"{SHARD} is corrupted \\(its CRC-32 differs"):
        checked_step(step)


def test_a_run_that_verifies_sizes_only_is_checked_so(tmp_path) -> None:
    """`checkpoint.verify=size`, as pretrain.py reads it: a same-size change passes."""
    step = _step(tmp_path / "checkpoints", 2, verify="size")
    assert not checksums_wanted(json.loads((step / "run.json").read_text()))
    assert checksums_wanted({"config": {}})
    _overwrite(step / SHARD)
    assert checked_step(step) == step


def test_a_step_without_run_json_is_checked_against_its_dcp_index(tmp_path) -> None:
    """Megatron-LM's and Megatron Bridge's steps carry none: what their DCP index places is
    checked instead, as the pre-flight checks it (`megatron_lm.unchecked_damage`)."""
    from tests.dcp_steps import dcp_step

    step = dcp_step(tmp_path / "checkpoints" / "iter_0000002")
    assert checked_step(step) == step
    (step / "__0_0.distcp").unlink()
    with pytest.raises(ConfigError, match=r"iter_0000002/__0_0.distcp is missing"):
        checked_step(step)


def test_the_fallback_of_an_import_is_the_import_again(tmp_path) -> None:
    imported = tmp_path / "ckpt"
    imported.mkdir()
    (imported / HF_IMPORT_SOURCE).mkdir()
    (imported / HF_IMPORT_SOURCE / "config.json").write_text("{}")
    (imported / IMPORT_CONFIG).write_text("{}")  # an import holds the recipe's config too
    assert fallback(imported).startswith("import the Hugging Face model again")
    lone = _step(tmp_path / "checkpoints", 2)
    assert fallback(lone).startswith("no earlier complete checkpoint exists")
    assert damage_line(Path("x"), lone, "it is bad") == f"checkpoint=x: it is bad; {fallback(lone)}"


def test_the_script_prints_one_line_exits_2_and_writes_nothing(tmp_path) -> None:
    step = _step(tmp_path / "run" / "checkpoints", 2)
    (step / SHARD).write_bytes(b"")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "export", f"checkpoint={step.parent}",
         f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith(f"error: checkpoint={step.parent}: step_0000002/{SHARD} is "
                                  "truncated or changed (0 of 10240 bytes)")
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))

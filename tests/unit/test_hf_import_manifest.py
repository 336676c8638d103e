"""An import writes the `run.json` a run's save writes (`trainer/interop/import_manifest.py`),
so the damage check pretrain.py and the export run covers it: a truncated `.distcp` in an
import is one line, exit 2, not `EOFError` tracebacks. The record is built here from files
written by hand; one real import (scripts/convert.py, one process, no ranks) shows the record
it writes and a damaged copy refused by both readers."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from trainer.checkpoint.manifest import damaged_file, format_problem, read_manifest
from trainer.checkpoint.preflight import checkpoint_preflight
from trainer.interop.export_step import checked_step
from trainer.interop.import_manifest import file_records, import_manifest
from trainer.one_rank import single_rank

SHARD = "__0_0.distcp"


def _import_dir(root: Path) -> Path:
    """An import's files (contents aside): Megatron's, config.yaml and hf/."""
    root.mkdir()
    (root / SHARD).write_bytes(bytes(range(256)) * 8)
    (root / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (root / "config.yaml").write_text("name: hf_tiny_llama\n")
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text("{}")
    (root / "run.json").write_text("{}")  # an earlier record is not a file of the import
    return root


def test_every_file_is_recorded_by_its_path_in_the_import(tmp_path) -> None:
    records = file_records(_import_dir(tmp_path / "imp"))
    assert sorted(records) == [SHARD, "config.yaml", "hf/config.json", "metadata.json"]
    assert records[SHARD]["bytes"] == 2048 and isinstance(records[SHARD]["crc32"], int)


def test_the_record_is_a_run_json_the_checks_read(tmp_path) -> None:
    cfg = get_recipe("hf_tiny_llama")
    directory = _import_dir(tmp_path / "imp")
    manifest = import_manifest(cfg, single_rank(cfg), file_records(directory), {"torch": "x"})
    (directory / "run.json").write_text(json.dumps(manifest))
    assert read_manifest(directory) == manifest
    assert (manifest["step"], manifest["world_size"], manifest["tokenizer"]) == (0, 1, None)
    assert manifest["padded_vocab_size"] == cfg.layout.padded_vocab
    assert damaged_file(directory, manifest, checksums=True) is None
    (directory / SHARD).write_bytes(b"cut")
    assert damaged_file(directory, manifest, checksums=True) == (
        f"imp/{SHARD} is truncated or changed (3 of 2048 bytes)")


def test_the_record_names_the_format_the_import_wrote(tmp_path) -> None:
    """torch_dist, whatever the recipe trains with: a Megatron FSDP recipe's import still
    loads into a run without Megatron FSDP."""
    recipe = get_recipe("hf_tiny_llama")
    fsdp = dataclasses.replace(recipe, optimizer=dataclasses.replace(
        recipe.optimizer, distributed=True, fsdp="optim_grads_params"))
    manifest = import_manifest(fsdp, single_rank(fsdp), {}, {})
    assert manifest["config"]["optimizer"]["fsdp"] == "none"
    loading = dataclasses.replace(recipe, checkpoint=dataclasses.replace(
        recipe.checkpoint, load=str(tmp_path), load_model_only=True))
    assert format_problem(loading, manifest) is None


@pytest.fixture(scope="module")
def imported(tiny_llama_import) -> tuple[Path, str]:
    """The tiny Llama imported by the script (the session's one import, tests/unit/conftest.py):
    its directory and the import's stderr."""
    done = tiny_llama_import.done
    assert done.returncode == 0, done.stderr
    return tiny_llama_import.out, done.stderr


def test_an_import_carries_run_json_and_a_damaged_one_is_one_line(imported, tmp_path) -> None:
    out, _ = imported
    manifest = read_manifest(out)
    assert manifest is not None and damaged_file(out, manifest, checksums=True) is None
    assert {SHARD, ".metadata", "config.yaml", "hf/config.json"} <= set(manifest["files"])
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in out.rglob("*"):
        if path.is_file():
            (damaged / path.relative_to(out)).parent.mkdir(exist_ok=True)
            (damaged / path.relative_to(out)).write_bytes(path.read_bytes())
    (damaged / SHARD).write_bytes((out / SHARD).read_bytes()[:5000])
    truncated = re.escape(f"damaged/{SHARD} is truncated or changed (5000 of")
    with pytest.raises(ConfigError, match=truncated):  # convert.py export
        checked_step(damaged)
    recipe = get_recipe("hf_tiny_llama")
    loading = dataclasses.replace(recipe, checkpoint=dataclasses.replace(
        recipe.checkpoint, load=str(damaged), load_model_only=True))
    with pytest.raises(ConfigError, match=truncated + r".*; import the Hugging Face model "
                       r"again \(scripts/convert.py import\)$"):  # pretrain.py's pre-flight
        checkpoint_preflight(loading)
    assert checkpoint_preflight(dataclasses.replace(loading, checkpoint=dataclasses.replace(
        loading.checkpoint, load=str(out)))) == []


def test_an_import_prints_no_async_save_notice(imported) -> None:
    """Megatron's 'MCore's async save is deprecated' is dropped where the import saves
    (`megatron_side.without_async_deprecation`, tests/unit/test_hf_save_warning.py)."""
    _, stderr = imported
    assert "async save is deprecated" not in stderr, stderr

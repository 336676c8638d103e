"""`convert.py export` refuses what it cannot read in one line, as pretrain.py does
(`trainer/interop/export_step.py`, `region_reader.py`): a file of a step without `run.json` that
torch DCP cannot read is named at the read site (not an `EOFError` or `UnpicklingError`
traceback); one of this project's `step_NNNNNNN` steps whose `run.json` is missing or broken is
refused with the pre-flight's own rule (`manifest.manifest_problem`), not read unchecked; a
`.tmp-` save and a run without `config.yaml` are refused before torch is imported, each with its
fix; and a checkpoint root's export names the step it resolved to. Steps are written by hand
(one process, torch DCP's `no_dist` save for the read-site rules): no training run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from tests.dcp_steps import dcp_step
from trainer.checkpoint.format import HF_IMPORT_SOURCE, MEGATRON_LM_TRACKER
from trainer.checkpoint.manifest import file_record
from trainer.interop.export_step import (
    checked_step,
    manifest_refusal,
    missing_config_line,
    resolve_step,
    run_config_file,
    step_line,
    unfinished_problem,
    unreadable_line,
)

REPO = Path(__file__).resolve().parents[2]
SHARD = "__0_0.distcp"
MARKER = '{"sharded_backend": "torch_dist"}'


def _step(root: Path, step: int, recipe: str = "hf_tiny_llama") -> Path:
    """A published step as this project saves it: marker, a shard, a whole `run.json`."""
    directory = root / f"step_{step:07d}"
    directory.mkdir(parents=True)
    (directory / "metadata.json").write_text(MARKER)
    (directory / SHARD).write_bytes(bytes(range(256)) * 4)
    files = {p.name: file_record(p) for p in directory.iterdir()}
    (directory / "run.json").write_text(json.dumps({
        "step": step, "consumed_samples": 8 * step, "consumed_tokens": 64 * step,
        "versions": {}, "config": {"name": recipe}, "files": files}))
    (root / "latest").write_text(directory.name)
    return directory


@pytest.fixture
def iter_root(tmp_path) -> Path:
    """A Megatron-LM root: iter_0000002 and iter_0000004, its tracker naming 4."""
    root = tmp_path / "save"
    dcp_step(root / "iter_0000002")
    dcp_step(root / "iter_0000004")
    (root / MEGATRON_LM_TRACKER).write_text("4")
    return root


def _fallback(root: Path) -> str:
    return (f"export the previous complete checkpoint with checkpoint={root / 'iter_0000002'} "
            f"(or delete {root / 'iter_0000004'}: the root then exports it)")


def _read_all(step: Path) -> None:
    from trainer.interop import region_reader

    stored = region_reader.stored_tensors(step)
    region_reader.read_regions(step, {"a": region_reader.Region("a", (0,), (4096,))}, stored)


# 1. A step read unchecked: what torch DCP raises on a damaged file, as one line.

def test_the_unreadable_line_names_step_file_and_fallback(iter_root) -> None:
    step = iter_root / "iter_0000004"
    assert unreadable_line(step, ".metadata") == (
        f"checkpoint {step} cannot be read (.metadata: cut short or damaged); "
        f"{_fallback(iter_root)}")
    assert unreadable_line(step, None, "missing").startswith(
        f"checkpoint {step} cannot be read (its .distcp files: missing); ")


def test_an_intact_unchecked_step_reads(iter_root) -> None:
    step = iter_root / "iter_0000004"
    assert checked_step(iter_root) == step  # no run.json: unchecked, as pretrain.py loads it
    _read_all(step)


@pytest.mark.parametrize("damage, file", [
    (lambda step: (step / ".metadata").write_bytes((step / ".metadata").read_bytes()[:100]),
     ".metadata: cut short or damaged"),  # pickle.UnpicklingError
    (lambda step: (step / ".metadata").write_bytes(b""), ".metadata: cut short or damaged"),
    (lambda step: (step / ".metadata").unlink(), ".metadata: missing"),  # FileNotFoundError
    (lambda step: (step / SHARD).write_bytes((step / SHARD).read_bytes()[:1000]),
     "its .distcp files: cut short or damaged"),  # read unchecked: RuntimeError inside DCP's
    (lambda step: (step / SHARD).unlink(), f"{SHARD}: missing"),  # FileNotFoundError
    (lambda step: (step / SHARD).write_bytes(bytes((step / SHARD).stat().st_size)),
     "its .distcp files: cut short or damaged"),  # same size, zeros: UnpicklingError
], ids=["index-cut", "index-empty", "index-missing", "shard-cut", "shard-missing",
        "shard-zeroed"])
def test_a_damaged_index_or_shard_is_one_line(iter_root, damage, file) -> None:
    """Each file of a step without run.json, damaged as a crash or a disk leaves it, is named
    with the step to fall back to."""
    step = iter_root / "iter_0000004"
    damage(step)
    with pytest.raises(ConfigError) as caught:
        _read_all(step)
    assert str(caught.value) == (f"checkpoint {step} cannot be read ({file}); "
                                 f"{_fallback(iter_root)}")


def test_only_what_a_damaged_file_raises_becomes_a_line(iter_root) -> None:
    """DCP's "metadata is None" (its index unread) is the index's line; another error is a bug
    and stays a traceback."""
    from torch.distributed.checkpoint.api import CheckpointException

    from trainer.interop.region_reader import damaged_read

    step = iter_root / "iter_0000004"
    unread = CheckpointException("read", {0: (AssertionError("metadata is None; x"), None)})
    assert str(damaged_read(step, unread)).startswith(
        f"checkpoint {step} cannot be read (.metadata: cut short or damaged); ")
    assert damaged_read(step, CheckpointException("read", {0: (KeyError("a"), None)})) is None
    assert damaged_read(step, AssertionError("planner is None")) is None


def test_a_step_without_run_json_is_checked_against_its_index_first(iter_root) -> None:
    """Before torch reads anything, the sizes DCP's own index places (as the pre-flight,
    `megatron_lm.unchecked_damage`): a shard cut short is named with the step to fall back to."""
    step = iter_root / "iter_0000004"
    (step / SHARD).write_bytes((step / SHARD).read_bytes()[:1000])
    with pytest.raises(ConfigError) as caught:
        checked_step(iter_root)
    assert str(caught.value).startswith(f"checkpoint={iter_root}: iter_0000004/{SHARD} is cut "
                                        "short (1000 of at least ")
    assert str(caught.value).endswith(_fallback(iter_root))


def test_the_script_says_a_damaged_unchecked_step_in_one_line(iter_root) -> None:
    from recipes.config.io import save_config
    from recipes.registry import get_recipe

    save_config(get_recipe("hf_tiny_llama"), iter_root / "config.yaml")
    step = iter_root / "iter_0000004"
    (step / ".metadata").write_bytes((step / ".metadata").read_bytes()[:100])
    out = iter_root.parent / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "export", f"checkpoint={iter_root}",
         f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"error: checkpoint={iter_root}: {step.name}/.metadata cannot be "
                           f"read (cut short or damaged); {_fallback(iter_root)}\n")
    assert not out.exists()


# 2. A step this project saved whose run.json is missing or broken: the pre-flight's rule.

@pytest.mark.parametrize("damage, what", [
    (lambda p: p.unlink(), "is missing (every step this project saves has one)"),
    (lambda p: p.write_text("{"), "cannot be read (not valid JSON: cut short or overwritten?)"),
])
def test_a_project_step_without_a_whole_run_json_is_refused(tmp_path, damage, what) -> None:
    root = tmp_path / "checkpoints"
    previous, step = _step(root, 2), _step(root, 3)
    damage(step / "run.json")
    line = (f"checkpoint={root}: step_0000003/run.json {what}; export the previous complete "
            f"checkpoint with checkpoint={previous} (or delete {step}: the root then exports it)")
    assert manifest_refusal(root, step) == line
    with pytest.raises(ConfigError) as caught:
        checked_step(root)
    assert str(caught.value) == line


def test_the_refusal_is_the_preflights(tmp_path) -> None:
    """pretrain.py refuses the same step for the same reason (only the fallback's command line
    differs)."""
    from recipes.resolve import resolve_config
    from trainer.checkpoint.preflight import checkpoint_preflight

    root = tmp_path / "checkpoints"
    _step(root, 3)
    (root / "step_0000003" / "run.json").write_text("{")
    cfg = resolve_config(["recipe=hf_tiny_llama", f"checkpoint.load={root}"])
    with pytest.raises(ConfigError) as caught:
        checkpoint_preflight(cfg)
    damage = "step_0000003/run.json cannot be read (not valid JSON: cut short or overwritten?)"
    assert str(caught.value).startswith(f"checkpoint.load={root}: {damage}; ")
    assert manifest_refusal(root, root / "step_0000003").startswith(f"checkpoint={root}: {damage}")


def test_steps_without_run_json_by_design_stay_unchecked(tmp_path) -> None:
    """Megatron-LM's `iter_NNNNNNN` and an import made before imports wrote run.json."""
    foreign = dcp_step(tmp_path / "save" / "iter_0000004")
    assert manifest_refusal(foreign, foreign) is None
    assert checked_step(foreign) == foreign
    imported = dcp_step(tmp_path / "ckpt")
    (imported / HF_IMPORT_SOURCE).mkdir()
    (imported / HF_IMPORT_SOURCE / "config.json").write_text("{}")
    (imported / "config.yaml").write_text("{}")
    assert manifest_refusal(imported, imported) is None
    assert checked_step(imported) == imported


# 3. The step a checkpoint root resolved to, named.

def test_a_step_given_itself_is_not_named_again(tmp_path) -> None:
    step = _step(tmp_path / "checkpoints", 2)
    assert step_line(step, step) is None


def test_a_roots_step_is_named(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    step = _step(root, 2)
    assert step_line(root, step) == f"exporting {step}"


@pytest.mark.parametrize("make, why", [
    (lambda root: None, "does not exist"),
    (lambda root: (root / "step_0000003").mkdir(), "has no metadata.json (an unfinished save?)"),
])
def test_a_latest_naming_an_incomplete_step_is_said(tmp_path, make, why) -> None:
    root = tmp_path / "checkpoints"
    step = _step(root, 2)
    (root / "latest").write_text("step_0000003")
    make(root)
    assert resolve_step(root) == step
    assert step_line(root, step) == (f"exporting {step}: latest names step_0000003, which "
                                     f"{why}, so the newest complete step is used")


def test_a_trackers_incomplete_step_is_said(iter_root) -> None:
    (iter_root / MEGATRON_LM_TRACKER).write_text("6")
    step = iter_root / "iter_0000004"
    assert step_line(iter_root, step) == (
        f"exporting {step}: {MEGATRON_LM_TRACKER} names iter_0000006, which does not exist, "
        "so the newest complete step is used")


def test_the_export_prints_the_line_before_reading(tmp_path) -> None:
    from rich.console import Console

    from trainer.interop.cli import checked_export_step

    root = tmp_path / "run" / "checkpoints"
    step = _step(root, 2)
    (tmp_path / "run" / "config.yaml").write_text("{}")
    console = Console(record=True, width=40)
    assert checked_export_step(root, console) == step
    assert console.export_text() == f"exporting {step}\n"  # whole, never wrapped


# 4. A .tmp- save; a run without config.yaml.

def test_an_unfinished_save_is_refused_with_the_complete_step(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    step = _step(root, 2)
    unfinished = root / "step_0000003.tmp-77-1a2b3c4d"
    unfinished.mkdir()
    (unfinished / "metadata.json").write_text(MARKER)  # even with Megatron's marker
    line = (f"checkpoint={unfinished} is an unfinished save (a .tmp- directory: a save in "
            f"progress, or one a crash left); export the newest complete step with "
            f"checkpoint={step}, or wait for the save to finish")
    assert unfinished_problem(unfinished) == line
    assert unfinished_problem(step) is None
    with pytest.raises(ConfigError) as caught:
        resolve_step(unfinished)
    assert str(caught.value) == line


def test_an_unfinished_first_save_says_there_is_no_step_yet(tmp_path) -> None:
    unfinished = tmp_path / "checkpoints" / "step_0000001.tmp-77-1a2b3c4d"
    unfinished.mkdir(parents=True)
    assert unfinished_problem(unfinished).endswith(
        "; wait for the save to finish (its root holds no complete step yet) or train again")


def test_a_run_without_config_yaml_is_told_how_to_write_it(tmp_path) -> None:
    root = tmp_path / "run" / "checkpoints"
    step = _step(root, 2)
    line = (f"checkpoint={root}: no config.yaml beside {step} or in its run directory "
            f"{tmp_path / 'run'}, which gives the model's shape; restore the run's config.yaml "
            "there, or write it: python scripts/pretrain.py recipe=hf_tiny_llama <the run's "
            f"overrides> print=config > {tmp_path / 'run' / 'config.yaml'}")
    assert missing_config_line(root, step) == line
    with pytest.raises(ConfigError) as caught:
        run_config_file(root, step)
    assert str(caught.value) == line
    (tmp_path / "run" / "config.yaml").write_text("{}")
    assert run_config_file(root, step) == tmp_path / "run" / "config.yaml"


def test_an_import_without_config_yaml_is_imported_again(tmp_path) -> None:
    imported = tmp_path / "ckpt"
    (imported / HF_IMPORT_SOURCE).mkdir(parents=True)
    (imported / HF_IMPORT_SOURCE / "config.json").write_text("{}")
    assert missing_config_line(imported, imported).endswith(
        "(an import keeps the recipe's config.yaml in its directory); import the Hugging Face "
        "model again (scripts/convert.py import) and export that")


def test_both_are_refused_before_torch_is_imported(tmp_path) -> None:
    root = tmp_path / "run" / "checkpoints"
    _step(root, 2)
    unfinished = root / "step_0000003.tmp-77-1a2b3c4d"
    unfinished.mkdir()
    code = ("import sys; from rich.console import Console; "
            "from plugins.protocol.errors import ConfigError; "
            "from trainer.interop.cli import checked_export_step\n"
            f"for given in ({str(unfinished)!r}, {str(root)!r}):\n"
            "    try: checked_export_step(__import__('pathlib').Path(given), Console())\n"
            "    except ConfigError as e: print(str(e).split(' ')[1])\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split("\n") == ["is", "no", "False", ""], done.stderr


def test_a_config_yaml_of_another_model_than_the_step_s_is_refused(tmp_path) -> None:
    """The export builds the model from the run's config.yaml: one of another shape than the
    step's run.json records (a hand-edited file) would export the tensors cut to that shape,
    silently; it is refused naming the field, and the recorded one exports."""
    from recipes.config.io import config_dict, save_config
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe
    from trainer.interop.exporter import run_config

    root = tmp_path / "run" / "checkpoints"
    step = _step(root, 2)
    manifest = json.loads((step / "run.json").read_text())
    saved = get_recipe("hf_tiny_llama")
    (step / "run.json").write_text(json.dumps({**manifest, "config": config_dict(saved)}))
    config = tmp_path / "run" / "config.yaml"
    save_config(apply_overrides(saved, ["model.num_layers=2"]), config)
    with pytest.raises(ConfigError) as error:
        run_config(step, root)
    assert str(error.value) == (
        f"checkpoint={root}: {config} does not describe the model saved in step_0000002 (it "
        f"was saved with model.num_layers={saved.model.num_layers}, the file has "
        "model.num_layers=2); put back the run's config.yaml (the step's run.json holds the "
        "config it was saved with)")
    save_config(saved, config)
    assert run_config(step, root).model.num_layers == saved.model.num_layers


def test_a_checkpoint_that_is_a_file_is_said_to_be_one(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("name: run\n")
    with pytest.raises(ConfigError) as error:
        resolve_step(config)
    assert str(error.value) == (f"checkpoint={config} is a file, not a folder; give a run's "
                                "checkpoints directory (runs/<run>/checkpoints) or one step "
                                "directory")
    with pytest.raises(ConfigError, match="does not exist; give a run's checkpoints"):
        resolve_step(tmp_path / "gone")

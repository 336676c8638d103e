"""Faults around checkpoints: what a long job on a cluster meets.

- A rank SIGKILLed during a save, at several points (before its shards are written, after
  every shard is written but before publication, after publication but before `latest`): the
  next start resumes from the previous complete checkpoint and continues exactly.
- A truncated or corrupted shard: refused before launch in one line naming the file and the
  previous complete checkpoint to fall back to; that fallback then loads.
- A model that cannot load the checkpoint (another width, vocabulary or tokenizer): refused
  before launch from the checkpoint's `run.json`; a changed global batch or learning rate is
  stated and the run continues from the consumed samples.
- A checkpoint object carrying pickled code: refused by the restricted unpickler, code not run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.resolve import resolve_config
from tests.dist.layout_runs import TEST_DATA
from tests.hang import HANG_S
from trainer.checkpoint.format import MANIFEST_FILE, newest_checkpoint
from trainer.checkpoint.manifest import file_record
from trainer.checkpoint.preflight import checkpoint_preflight, validate_paths

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.resume_runs"
RECIPE, RANKS, STEPS = "tiny_dp2_distopt", 2, 4
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def saved(launch_ranks, tmp_path_factory) -> tuple[Path, list[dict]]:
    """An uninterrupted run saving after steps 1 and 2, and its per-step records."""
    root = tmp_path_factory.mktemp("saved")
    checkpoints = root / "checkpoints"
    result = launch_ranks(RANKS, f"{ENTRY}:continuous", {
        "recipe": RECIPE, "steps": STEPS, "run_dir": str(root), "save_at": [1, 2],
        "checkpoint_dir": str(checkpoints),
    })[0]
    return checkpoints, result["records"]


def _copy(saved_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(saved_root, root)
    return root


def _cfg(root: Path, *overrides: str):
    cfg = resolve_config([f"recipe={RECIPE}", *TEST_DATA, f"checkpoint.load={root}", *overrides])
    validate_paths(cfg)
    return cfg


def test_damaged_checkpoint_stops_pretrain_in_one_line_before_any_rank(saved, tmp_path):
    root = _copy(saved[0], tmp_path)
    _damage(sorted((root / "step_0000002").glob("__0_*.distcp"))[0], "truncated")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), f"recipe={RECIPE}",
         *TEST_DATA, f"checkpoint.load={root}", f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: checkpoint.load={root}: step_0000002/__0_")
    assert "launching" not in result.stdout  # refused before any rank


def test_manifest_lists_every_file_with_versions_and_config(saved):
    step = saved[0] / "step_0000002"
    manifest = json.loads((step / MANIFEST_FILE).read_text())
    on_disk = {p.name for p in step.iterdir() if p.name != MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk
    assert all(manifest["files"][name] == file_record(step / name) for name in on_disk)
    assert {"torch", "megatron-core", "mcore-recipes"} <= set(manifest["versions"])
    assert (manifest["step"], manifest["consumed_samples"]) == (2, 16)
    assert manifest["config"]["optimizer"]["distributed"] is True
    assert manifest["layout"] == {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "dp": 2}


KILL_POINTS = [
    ("save._write_sharded", 1),  # rank 1 dies before writing; rank 0 is inside Megatron's save
    ("publish._write_manifest", 1),  # every shard written, nothing checksummed or published
    ("publish._rename_into_place", 0),  # everything written, not yet renamed
    ("publish._point_latest", 0),  # renamed into place, `latest` still names the previous step
]


@pytest.mark.parametrize(("kill_at", "kill_rank"), KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_rank_killed_during_save_resumes_from_previous_checkpoint(
    launch_ranks, saved, tmp_path, kill_at, kill_rank
):
    saved_root, records = saved
    root = _copy(saved_root, tmp_path)
    common = {"recipe": RECIPE, "run_dir": str(tmp_path), "checkpoint_dir": str(root),
              "overrides": [f"checkpoint.load={root}"]}
    with pytest.raises(RuntimeError, match=r"exit codes \[.*-9"):  # the launch's error
        launch_ranks(RANKS, f"{ENTRY}:die_during_save",
                     {**common, "kill_at": kill_at, "kill_rank": kill_rank})
    assert newest_checkpoint(root).name == "step_0000002"
    assert checkpoint_preflight(_cfg(root))  # intact: the pre-flight passes and says so
    after = launch_ranks(RANKS, f"{ENTRY}:resumed", {**common, "steps": STEPS})[0]
    assert (after["start"], after["resumed_from"]) == (2, "step_0000002")
    assert after["records"] == records[2:]


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_damaged_shard_is_named_with_the_previous_checkpoint_to_fall_back_to(
    saved, tmp_path, how
):
    root = _copy(saved[0], tmp_path)
    shard = sorted((root / "step_0000002").glob("__1_*.distcp"))[0]
    _damage(shard, how)
    with pytest.raises(ConfigError) as refused:
        checkpoint_preflight(_cfg(root))
    message = str(refused.value)
    assert f"step_0000002/{shard.name} is {how}" in message
    assert f"checkpoint.load={root / 'step_0000001'}" in message
    assert "\n" not in message
    notes = checkpoint_preflight(_cfg(root / "step_0000001"))  # the named fallback loads
    assert "step 1" in notes[0]


@pytest.mark.parametrize(("override", "field"), [
    ("model.hidden_size=128", "model.hidden_size=64, this run has model.hidden_size=128"),
    ("model.vocab_size=300", "model.vocab_size=256, this run has model.vocab_size=300"),
    ("model.make_vocab_size_divisible_by=512", "padded to 256 rows, this run pads to 512"),
])
def test_a_model_that_cannot_load_the_checkpoint_is_refused_before_launch(
    saved, override, field
):
    with pytest.raises(ConfigError, match="does not fit this run's model") as refused:
        checkpoint_preflight(_cfg(saved[0], override))
    assert field in str(refused.value)


def test_changed_batch_and_lr_are_stated_and_the_run_continues_from_consumed_samples(
    launch_ranks, saved, tmp_path
):
    root = _copy(saved[0], tmp_path)
    changed = ["train.global_batch_size=16", "optimizer.lr=0.001"]
    notes = checkpoint_preflight(_cfg(root, *changed))
    assert "train.global_batch_size 8 -> 16" in notes[1]
    assert "optimizer.lr 0.003 -> 0.001" in notes[1]
    after = launch_ranks(RANKS, f"{ENTRY}:resumed", {
        "recipe": RECIPE, "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": [*changed, f"checkpoint.load={root}"],
    })[0]
    assert [r["samples"] for r in after["records"]] == [32, 48]  # 16 consumed, then +16 each


def test_pickled_code_in_a_checkpoint_is_refused_and_not_run(launch_ranks, tmp_path):
    marker = tmp_path / "code-ran"
    result = launch_ranks(1, f"{ENTRY}:save_with_planted_object", {
        "recipe": "tiny_dp1", "run_dir": str(tmp_path), "marker": str(marker),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
    })[0]
    assert not result["ran_code"]
    assert "rng_state" in result["refused"] and "pickled code" in result["refused"]

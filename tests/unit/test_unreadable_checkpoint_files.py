"""A checkpoint file or step directory this user may not read (chmod, another user's run) is
one line before any rank starts: the file, 'not readable (permissions)', the fix (run as its
owner, or chmod) and the previous complete step to fall back to; never a `PermissionError`
traceback from the pre-flight, nor a pre-flight that passes under `checkpoint.verify=size`
and a DCP failure in every rank.

Root reads through any chmod, so most tests make the probe refuse (`readable`); the real chmod
test runs only as another user.
"""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from tests.hang import HANG_S
from tests.plain_user import plain_user_prefix
from tests.unit.checkpoint_damage_fixtures import load_cfg, project_root
from trainer.checkpoint import checksums
from trainer.checkpoint import format as ckpt_format
from trainer.checkpoint import manifest as ckpt_manifest
from trainer.checkpoint.format import (
    complete_steps,
    damaged_newest,
    is_checkpoint,
    newest_checkpoint,
    step_damage,
    unreadable_text,
)
from trainer.checkpoint.manifest import damaged_file, manifest_problem, read_manifest
from trainer.checkpoint.preflight import check_checkpoint_load_path, checkpoint_preflight

REPO = Path(__file__).resolve().parents[2]


def _chmod_000(monkeypatch, denied: Path) -> None:
    """What `chmod 000 denied` does to a non-root user, for root too: the directory cannot be
    listed, and nothing in it can be stat'ed or opened."""
    def refuse(path) -> bool:
        return Path(os.fsdecode(path)).parent == denied

    def error(path):
        return PermissionError(13, "Permission denied", os.fsdecode(path))

    real_stat, real_open = os.stat, io.open
    real_scandir, real_listdir = os.scandir, os.listdir

    def stat(path, *args, **kwargs):
        if isinstance(path, (str, bytes, os.PathLike)) and refuse(path):
            raise error(path)
        return real_stat(path, *args, **kwargs)

    def opener(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and refuse(file):
            raise error(file)
        return real_open(file, *args, **kwargs)

    def lister(real):
        def listing(path=".", *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)) and Path(os.fsdecode(path)) == denied:
                raise error(path)
            return real(path, *args, **kwargs)
        return listing

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(io, "open", opener)
    monkeypatch.setattr(os, "scandir", lister(real_scandir))
    monkeypatch.setattr(os, "listdir", lister(real_listdir))


def _refuse(monkeypatch, module, *denied: Path) -> None:
    """`module.readable` says no for `denied` (what a chmod 000 does to a non-root user)."""
    monkeypatch.setattr(module, "readable", lambda path: Path(path) not in denied)


def test_is_checkpoint_and_complete_steps_swallow_a_permission_error(tmp_path,
                                                                      monkeypatch) -> None:
    root = project_root(tmp_path / "checkpoints")
    denied = root / "step_0000006"
    real = pathlib.Path.is_file

    def is_file(self):
        if self.parent == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    assert is_checkpoint(denied) is False
    assert [p.name for p in complete_steps(root)] == ["step_0000002", "step_0000004"]


def test_an_unreadable_step_directory_is_damage(tmp_path, monkeypatch) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    _refuse(monkeypatch, ckpt_format, step)
    damage = step_damage(step)
    assert damage.startswith("step_0000006 is not readable (permissions): run as its owner (")
    assert damage.endswith(f"or make it readable with chmod -R a+rX {step}")
    assert step_damage(root / "step_0000004") is None


def test_a_root_whose_newest_step_is_unreadable_names_it_not_the_older_one(
        tmp_path, monkeypatch) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    _refuse(monkeypatch, ckpt_format, step)
    assert damaged_newest(root) == step
    message = check_checkpoint_load_path(load_cfg(root))
    assert message.startswith(f"checkpoint.load={root}: step_0000006 is not readable "
                              "(permissions): run as its owner")
    assert message.endswith(f"fall back to the previous complete checkpoint with "
                            f"checkpoint.load={root / 'step_0000004'} (or delete {step}: the "
                            "root then resumes from it)")
    assert "\n" not in message


def test_an_unreadable_step_named_directly_is_refused_with_the_fallback(tmp_path,
                                                                      monkeypatch) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    _refuse(monkeypatch, ckpt_format, step)
    message = check_checkpoint_load_path(load_cfg(step))
    assert message.startswith(f"checkpoint.load={step}: step_0000006 is not readable")
    assert f"checkpoint.load={root / 'step_0000004'}" in message


def test_an_older_unreadable_step_does_not_block_the_newest(tmp_path, monkeypatch) -> None:
    root = project_root(tmp_path / "checkpoints")
    _refuse(monkeypatch, ckpt_format, root / "step_0000002")
    assert damaged_newest(root) is None
    assert newest_checkpoint(root) == root / "step_0000006"
    assert check_checkpoint_load_path(load_cfg(root)) is None


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("name", ["__0_0.distcp", ".metadata", "metadata.json"])
def test_every_listed_file_is_checked_for_readability(tmp_path, monkeypatch, name,
                                                      checksums) -> None:
    step = project_root(tmp_path / "checkpoints") / "step_0000006"
    _refuse(monkeypatch, ckpt_manifest, step / name)
    assert damaged_file(step, read_manifest(step), checksums) == unreadable_text(
        step / name, f"step_0000006/{name}")


def test_a_read_error_while_checksumming_is_a_line(tmp_path, monkeypatch) -> None:
    step = project_root(tmp_path / "checkpoints") / "step_0000006"

    def denied(path, advance=None):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(checksums, "file_crc32", denied)
    assert "is not readable (permissions)" in damaged_file(step, read_manifest(step), True)
    assert damaged_file(step, read_manifest(step), False) is None


def test_an_unreadable_run_json_is_named_with_its_fix(tmp_path, monkeypatch) -> None:
    step = project_root(tmp_path / "checkpoints") / "step_0000006"
    real = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        if self == step / "run.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    assert manifest_problem(step).startswith(
        "step_0000006/run.json is not readable (permissions): run as its owner")


@pytest.mark.parametrize("verify", ["checksum", "size"])
def test_the_preflight_refuses_an_unreadable_shard_under_either_verify(
        tmp_path, monkeypatch, verify) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    _refuse(monkeypatch, ckpt_manifest, step / "__0_0.distcp")
    with pytest.raises(ConfigError) as err:
        checkpoint_preflight(load_cfg(root, verify=verify))
    assert str(err.value).startswith(
        f"checkpoint.load={root}: step_0000006/__0_0.distcp is not readable (permissions)")
    assert f"checkpoint.load={root / 'step_0000004'}" in str(err.value)


@pytest.mark.parametrize("named", ["root", "step", "file"])
def test_a_simulated_chmod_000_step_is_one_line_wherever_it_is_named(tmp_path, monkeypatch,
                                                                    named) -> None:
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    load = {"root": root, "step": step, "file": step / "run.json"}[named]
    _chmod_000(monkeypatch, step)
    with pytest.raises(PermissionError):
        (step / "metadata.json").is_file()  # the simulation refuses as chmod 000 would
    message = check_checkpoint_load_path(load_cfg(load))
    assert message.startswith(f"checkpoint.load={load}: step_0000006 is not readable "
                              "(permissions): run as its owner")
    assert f"chmod -R a+rX {step}" in message
    assert f"checkpoint.load={root / 'step_0000004'}" in message


def test_a_real_chmod_000_step_is_refused(tmp_path) -> None:
    """For real, in a process of its own: as root with the capabilities that read through
    permissions dropped (setpriv), as anyone else as it is."""
    prefix = plain_user_prefix()
    root = project_root(tmp_path / "checkpoints")
    step = root / "step_0000006"
    code = ("import sys\n"
            "from tests.unit.checkpoint_damage_fixtures import load_cfg\n"
            "from trainer.checkpoint.preflight import check_checkpoint_load_path\n"
            "print(check_checkpoint_load_path(load_cfg(sys.argv[1])))\n")
    step.chmod(0)
    try:
        result = subprocess.run([*prefix, sys.executable, "-c", code, str(root)], cwd=REPO,
                                capture_output=True, text=True, timeout=HANG_S)
    finally:
        step.chmod(0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"checkpoint.load={root}: step_0000006 is not readable")

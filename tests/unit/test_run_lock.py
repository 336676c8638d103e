"""One run at a time in a run directory (trainer/entry/pipeline.py `hold_run_lock`): a second
run would delete the first one's save in progress when it cleans up unfinished saves. The lock
is a POSIX lock held by the launching process: another process is refused in one line naming
the directory and the holder's pid (exit 2 from pretrain.py, before anything is written), a
lock file left by a run that died does not refuse anyone, and a dry run does not take it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plugins.protocol.errors import UserError
from tests.hang import HANG_S
from trainer.entry import pipeline

REPO = Path(__file__).resolve().parents[2]
HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer.entry.pipeline import hold_run_lock
    hold_run_lock(Path(sys.argv[1]))
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
""")


@pytest.fixture
def released():
    """Locks this test process takes are given up again at its end."""
    before = set(pipeline._held_locks)
    yield
    for path in set(pipeline._held_locks) - before:
        pipeline._held_locks.pop(path).close()


def holder(run_dir: Path, seconds: float = HANG_S) -> subprocess.Popen:
    """Another process that holds `run_dir`'s lock for `seconds` (it says so first)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), str(seconds)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_directory_and_the_holder(tmp_path, released):
    proc = holder(tmp_path)
    try:
        with pytest.raises(UserError) as refused:
            pipeline.hold_run_lock(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    line = str(refused.value)
    assert "\n" not in line
    assert f"the run directory {tmp_path} is in use by another run (pid {proc.pid} " in line
    assert "wait for that run to end, or give this one another run_dir=" in line


def test_a_dead_holder_s_file_refuses_nobody(tmp_path, released):
    proc = holder(tmp_path, seconds=0)
    proc.wait()
    assert (tmp_path / pipeline.RUN_LOCK).read_text().strip() == str(proc.pid)
    pipeline.hold_run_lock(tmp_path)  # a resume after a crash, a requeued job
    assert (tmp_path / pipeline.RUN_LOCK).read_text().strip() == str(os.getpid())


def test_the_holder_takes_it_again_and_keeps_it(tmp_path, released):
    pipeline.hold_run_lock(tmp_path)
    pipeline.hold_run_lock(tmp_path)  # the next launch of a run in phases, same process
    other = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path), "0"], cwd=REPO,
                           capture_output=True, text=True, timeout=HANG_S,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert other.returncode != 0 and f"(pid {os.getpid()} holds" in other.stderr


def test_a_checkpoint_root_linked_elsewhere_is_locked_too(tmp_path, released):
    run_dir, root = tmp_path / "run", tmp_path / "shared-checkpoints"
    run_dir.mkdir()
    root.mkdir()
    (run_dir / "checkpoints").symlink_to(root)
    pipeline.hold_run_lock(run_dir)
    assert (root / pipeline.RUN_LOCK).read_text().strip() == str(os.getpid())


def pretrain(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "pretrain.py"), *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_S)


def test_pretrain_refuses_a_run_directory_in_use_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("# the first run's\n")
    proc = holder(run_dir)
    try:
        done = pretrain("recipe=tiny_dp1", "scheduler.warmup_iters=2", "train.train_iters=4",
                       f"run_dir={run_dir}")
        dry = pretrain("recipe=tiny_dp1", "dry_run=true", f"run_dir={run_dir}")
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: the run directory {run_dir} is in use by another run (pid {proc.pid} holds "
        f"{run_dir / pipeline.RUN_LOCK}); wait for that run to end, or give this one another "
        "run_dir="]
    assert "launching" not in done.stdout
    assert (run_dir / "config.yaml").read_text() == "# the first run's\n"
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]

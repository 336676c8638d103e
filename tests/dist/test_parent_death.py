"""A run's processes end with the process that started them (trainer/parent_watch.py
`end_with_parent`): torch's launcher starts each rank in a session of its own, so a launcher
killed with SIGKILL would leave its ranks training, and a rank killed so would leave what it
forked (the asynchronous writer's results manager, a copy of the rank) running under init.
Each test starts a real run of tiny_dp1 through pretrain.py's own launcher and kills one
process of it with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
# Far more steps than a run could take within HANG_S: a process that outlived its killed
# parent would still be training when the wait for its end gives up (a wait is never a speed
# check, tests/hang.py).
TINY = ["recipe=tiny_dp1", "scheduler.warmup_iters=2", "train.train_iters=1000000",
        "train.eval_interval=0", "train.eval_iters=0"]


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return None if state in "ZX" else (state, int(ppid))


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = proc_state(int(entry.name))
            if info is not None and info[1] == pid:
                found.append(int(entry.name))
    return found


def arguments(pid: int) -> list[str]:
    """The command line of a live process; [] when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def the_rank(launcher: subprocess.Popen) -> int:
    """The launcher's one rank: its child running pretrain.py on the run's saved config, not
    merely its first child (a child the launcher ran for a moment would be taken for the rank;
    suspected, not seen, in one CI run where the rank showed no saves' processes)."""
    def ranks() -> list[int]:
        return [pid for pid in children(launcher.pid)
                if any(arg.startswith("config=") for arg in arguments(pid))]

    [rank] = wait_for(ranks, HANG_S, "the launcher's rank")
    return rank


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    """`condition()`'s first true value, polled until `timeout` seconds have passed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def trained(run_dir: Path) -> bool:
    """The rank logged a training step (it is past start-up, in its loop)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("kind") == "train":
                return True
        except ValueError:
            continue
    return False


def start_run(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """pretrain.py in a session of its own (as `setsid ... &` from a shell), output to a file."""
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 - the child's, closed with the test
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), *TINY,
         f"run_dir={tmp_path / 'run'}", *overrides],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of the processes this test started or saw started, one by one."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_a_rank_ends_when_its_launcher_is_killed(tmp_path):
    launcher = start_run(tmp_path)
    seen = [launcher.pid]
    try:
        rank = the_rank(launcher)
        seen.append(rank)
        wait_for(lambda: trained(tmp_path / "run") or launcher.poll() is not None, HANG_S,
                 "a training step")
        assert launcher.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        launcher.kill()
        launcher.wait()
        wait_for(lambda: proc_state(rank) is None, HANG_S,
                 f"rank {rank} ended after its launcher was killed")
    finally:
        kill_all(seen)
        launcher.wait()


def test_the_async_writer_s_helpers_end_when_their_rank_is_killed(tmp_path):
    launcher = start_run(tmp_path, "checkpoint.async_save=true", "checkpoint.save_interval=1")
    seen = [launcher.pid]
    try:
        rank = the_rank(launcher)
        seen.append(rank)
        # The results manager is forked at the first asynchronous save and lives on.
        wait_for(lambda: (tmp_path / "run" / "checkpoints" / "latest").is_file()
                 or launcher.poll() is not None, HANG_S, "a published checkpoint")
        assert launcher.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        try:  # looked at for a while, not once: a scan of /proc is not atomic
            forked = wait_for(lambda: children(rank), HANG_S, "the rank's forked processes")
        except AssertionError:
            raise AssertionError(
                "the rank forked no process for its asynchronous saves; the launcher's children: "
                f"{[arguments(pid) for pid in children(launcher.pid)]}, the rank {rank} "
                f"({proc_state(rank) or 'gone'}): {arguments(rank)}; its log ends: "
                f"{(tmp_path / 'run.log').read_text()[-2000:]}") from None
        seen.extend(forked)
        os.kill(rank, signal.SIGKILL)
        wait_for(lambda: not [pid for pid in forked if proc_state(pid) is not None], HANG_S,
                 f"the rank's forked processes {forked} ended after it was killed")
    finally:
        kill_all(seen)
        launcher.wait()

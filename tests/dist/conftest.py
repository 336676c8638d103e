"""The one way distributed tests start gloo ranks: the `launch_ranks` fixture.

    results = launch_ranks(2, "tests.dist.my_checks:check_something", {"key": "value"})

starts 2 local processes with `python -m torch.distributed.run --standalone` (which picks a
free port itself), each running tests/dist/rank_entry.py: join the gloo group, call
`check_something(payload)`, and write its JSON-serialisable result. `launch` returns the
results in rank order, or raises `RankLaunchError` (a RuntimeError) carrying the tail of each
rank's stderr. The entry runs with the default gloo group already initialised; it decides
itself whether to activate the CPU runtime. The repo root is on the ranks' PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RANK_ENTRY = Path(__file__).resolve().with_name("rank_entry.py")
STDERR_TAIL_CHARS = 3000
STOP_GRACE_S = 15  # how long a timed-out launcher gets to stop its ranks

LaunchRanks = Callable[..., list[Any]]


class RankLaunchError(RuntimeError):
    """A launch whose ranks failed, timed out or returned no result."""


def _tail(path: Path) -> str:
    if not path.exists():
        return "(no output)"
    return path.read_text(errors="replace")[-STDERR_TAIL_CHARS:]


def _failure_report(what: str, run_dir: Path, nprocs: int) -> str:
    parts = [what]
    for rank in range(nprocs):
        parts.append(f"--- rank {rank} stderr (tail) ---\n{_tail(run_dir / f'rank{rank}.stderr')}")
    parts.append(f"--- launcher output (tail) ---\n{_tail(run_dir / 'launcher.log')}")
    return "\n".join(parts)


def _child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # One intra-op thread per rank by default (ranks share few cores); torchrun warns otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _stop_timed_out_launch(launcher: subprocess.Popen, run_dir: Path) -> None:
    """Ends the launcher and its ranks. torchrun stops its ranks on SIGTERM, but it starts
    each rank in a session of its own, so any rank still alive after that is killed by the
    pid it recorded."""
    launcher.terminate()
    try:
        launcher.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    for pid_file in run_dir.glob("rank*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _run_launcher(command: list[str], run_dir: Path, timeout: float, nprocs: int) -> None:
    with open(run_dir / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=_child_environment(),
            start_new_session=True,  # its own process group, for the SIGKILL fallback
        )
        try:
            returncode = launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_timed_out_launch(launcher, run_dir)
            raise RankLaunchError(
                _failure_report(f"ranks timed out after {timeout} s", run_dir, nprocs)
            ) from None
    if returncode != 0:
        raise RankLaunchError(
            _failure_report(f"ranks failed (launcher exit code {returncode})", run_dir, nprocs)
        )


@pytest.fixture(scope="session")
def launch_ranks(tmp_path_factory: pytest.TempPathFactory) -> LaunchRanks:
    """A callable `launch(nprocs, entry, payload=None, timeout=300) -> list[result per rank]`."""
    base_dir = tmp_path_factory.mktemp("ranks")

    def launch(
        nprocs: int, entry: str, payload: dict | None = None, timeout: float = 300
    ) -> list[Any]:
        run_dir = Path(tempfile.mkdtemp(prefix="launch-", dir=base_dir))
        payload_path = run_dir / "payload.json"
        payload_path.write_text(json.dumps(payload or {}))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nprocs}",
            str(RANK_ENTRY),
            entry,
            str(payload_path),
            str(run_dir),
            str(timeout),
        ]
        _run_launcher(command, run_dir, timeout, nprocs)
        missing = [rank for rank in range(nprocs) if not (run_dir / f"rank{rank}.json").exists()]
        if missing:
            raise RankLaunchError(
                _failure_report(f"ranks {missing} wrote no result", run_dir, nprocs)
            )
        return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in range(nprocs)]

    return launch

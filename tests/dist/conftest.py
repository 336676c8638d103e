"""The one way distributed tests start gloo ranks: the `launch_ranks` fixture.

    results = launch_ranks(2, "tests.dist.my_checks:check_something", {"key": "value"})

starts 2 local ranks, forked by the session's rank fork server (tests/dist/fork_server.py:
torch and Megatron Core are imported once per session, not once per rank), each doing what
tests/dist/rank_entry.py does: join the gloo group through a store on a port the OS picks, call
`check_something(payload)`, and write its JSON-serialisable result. `launch` returns the
results in rank order, or raises `RankLaunchError` (a RuntimeError) carrying the tail of each
rank's stderr. The entry runs with the default gloo group already initialised; it decides
itself whether to activate the CPU runtime. The repo root is on the ranks' PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hang import HANG_S

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
    return "\n".join(parts)


def _child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # One intra-op thread per rank by default (ranks share few cores); torchrun warns otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class ForkServer:
    """The session's tests/dist/fork_server.py process: it has imported torch and Megatron
    Core once and forks the ranks of each launch (see its docstring for why and how)."""

    def __init__(self, log_path: Path) -> None:
        self._log = open(log_path, "w")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.dist.fork_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO_ROOT,
            env=_child_environment(),
            text=True,
        )
        self._in_flight = False  # a request written whose reply was not read
        self._reply()  # {"ready": true} once the imports are done

    def _reply(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            raise RankLaunchError(f"the rank fork server stopped; see {self._log.name}")
        return json.loads(line)

    def launch(self, request: dict) -> dict:
        self._in_flight = True
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._reply()
        self._in_flight = False
        return reply

    def close(self) -> None:
        """End the server. Once every reply is read its ranks are all reaped (and their groups
        stopped), so it is killed at once: waiting for its interpreter's shutdown (torch's and
        Megatron's teardown, about 3 s at the end of every session) serves nothing. A launch
        cut short (Ctrl-C while waiting) may still have ranks running: then the server gets the
        end of its input and the grace period to stop them, as before."""
        self._process.stdin.close()
        if self._in_flight:
            try:
                self._process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self._process.kill()  # no-op for an exited process
        self._process.wait()
        self._log.close()


def _check_launch(reply: dict, run_dir: Path, timeout: float, nprocs: int) -> None:
    if reply["timed_out"]:
        what = f"ranks timed out after {timeout} s"
        raise RankLaunchError(_failure_report(what, run_dir, nprocs))
    failed = [rank for rank, code in enumerate(reply["returncodes"]) if code != 0]
    if failed:
        codes = reply["returncodes"]
        raise RankLaunchError(
            _failure_report(f"ranks {failed} failed (exit codes {codes})", run_dir, nprocs)
        )


@pytest.fixture(scope="session")
def launch_ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchRanks]:
    """A callable `launch(nprocs, entry, payload=None, timeout=HANG_S) -> list[result per
    rank]`: the timeout is a safety net for a hung launch (tests/hang.py), never a speed limit."""
    base_dir = tmp_path_factory.mktemp("ranks")
    server = ForkServer(base_dir / "fork_server.log")

    def start(nprocs: int, entry: str, payload: dict | None, timeout: float):
        run_dir = Path(tempfile.mkdtemp(prefix="launch-", dir=base_dir))
        payload_path = run_dir / "payload.json"
        payload_path.write_text(json.dumps(payload or {}))
        return server.launch({
            "nprocs": nprocs, "entry": entry, "payload": str(payload_path),
            "run_dir": str(run_dir), "timeout": timeout,
        }), run_dir

    def launch(
        nprocs: int, entry: str, payload: dict | None = None, timeout: float = HANG_S
    ) -> list[Any]:
        reply, run_dir = start(nprocs, entry, payload, timeout)
        _check_launch(reply, run_dir, timeout, nprocs)
        missing = [rank for rank in range(nprocs) if not (run_dir / f"rank{rank}.json").exists()]
        if missing:
            raise RankLaunchError(
                _failure_report(f"ranks {missing} wrote no result", run_dir, nprocs)
            )
        return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in range(nprocs)]

    yield launch
    server.close()


"""A rank fork server: imports torch and Megatron Core once, then forks the ranks of each launch.

Why: a distributed test case spends most of its time not training but importing. Every rank of
a `torchrun` launch imports torch and Megatron Core afresh (about 10 s of CPU per rank), and on a
2-core CI machine a 4-rank launch waits some 20 s before its first step. This server pays that
once per test session: it imports the heavy modules, then, for each launch request, forks one
child per rank. Each child is a fresh copy of a process that has imported but never run
anything (no torch op, no thread pool, no process group), so it starts exactly as a torchrun
rank would, only without the import.

Protocol (one JSON object per line): the test process writes
    {"nprocs": N, "entry": "module:function", "payload": PATH, "run_dir": DIR, "timeout": S}
to stdin and reads back {"returncodes": [...], "timed_out": bool}. Each rank does what
tests/dist/rank_entry.py does under torchrun (stderr to DIR/rank<R>.stderr, pid file, gloo group,
result to DIR/rank<R>.json); the gloo rendezvous goes through a TCPStore that rank 0 opens on a
port the OS picks (port 0), published to the others in DIR/store_port, so no port is fixed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

POLL_S = 0.05


def _preload() -> None:
    """The modules every rank imports; none of them starts a thread or runs a torch op."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    from megatron.core import parallel_state  # noqa: F401
    from megatron.core.models.gpt import GPTModel  # noqa: F401

    import tests.dist.rank_entry  # noqa: F401
    import trainer.checkpoint.load  # noqa: F401
    import trainer.checkpoint.save  # noqa: F401
    import trainer.loop  # noqa: F401
    import trainer.session  # noqa: F401


def _store(rank: int, world_size: int, run_dir: Path, timeout_s: float):
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    port_file = run_dir / "store_port"
    if rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size, True, timeout=timeout, wait_for_workers=False
        )
        partial = run_dir / "store_port.partial"
        partial.write_text(str(store.port))
        partial.rename(port_file)
        return store, store.port
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 published no store port in {timeout_s} s")
        time.sleep(POLL_S)
    port = int(port_file.read_text())
    return dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout), port


def _rank_main(rank: int, request: dict) -> None:
    """The body of one forked rank; mirrors rank_entry.main but joins through a TCPStore."""
    from tests.dist import rank_entry

    nprocs, run_dir = request["nprocs"], Path(request["run_dir"])
    # The server's stdout is its reply channel: a rank's prints go to a file of its own.
    stdout_file = open(run_dir / f"rank{rank}.stdout", "w")  # open until the rank exits
    os.dup2(stdout_file.fileno(), 1)
    rank_entry.start_rank(rank, run_dir)
    store, port = _store(rank, nprocs, run_dir, float(request["timeout"]))
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    rank_entry.run_rank(
        request["entry"], Path(request["payload"]), run_dir, float(request["timeout"]), store=store
    )


def _fork_rank(rank: int, request: dict) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        _rank_main(rank, request)
        code = 0
    except BaseException:  # a rank reports every failure through its stderr file and exit code
        traceback.print_exc()
    finally:
        _exit(code)


def _exit(code: int) -> None:
    """Ends a forked rank as an interpreter exit would, then for good: the atexit handlers run
    (multiprocessing's among them, which shuts down helper processes such as the manager
    Megatron's checkpoint writer starts, `dist_checkpointing/strategies/filesystem_async.py:64`;
    skipping them leaves those processes orphaned), and `os._exit` keeps the rank from
    returning into the server's loop."""
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pids: list[int], timeout_s: float) -> tuple[list[int | None], bool]:
    """Exit codes in rank order and whether the launch timed out. As torchrun does, the first
    rank that fails brings the others down (they would wait for it in a collective until the
    timeout); those are reported with the signal that stopped them."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if any(code != 0 for code in codes.values()):
            break
        time.sleep(POLL_S)
    timed_out = len(codes) < len(pids) and not any(code != 0 for code in codes.values())
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        _stop_group(pid)
    return [codes[pid] for pid in pids], timed_out


def _stop_group(pid: int) -> None:
    """Each rank leads its own process group (`os.setsid`); a rank killed before its atexit
    handlers ran leaves its helper processes (the checkpoint writer's manager) in that group:
    stop them too, as the rank's own exit would have."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def serve() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pids = [_fork_rank(rank, request) for rank in range(request["nprocs"])]
        codes, timed_out = _wait(pids, float(request["timeout"]))
        print(json.dumps({"returncodes": codes, "timed_out": timed_out}), flush=True)


if __name__ == "__main__":
    serve()

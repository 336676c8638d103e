"""One function run in several fresh processes, forked from one interpreter that imported torch
and Megatron Core once.

Why: a check that changes process-wide state (the CPU runtime's patches, a Megatron fix left
out) needs a process of its own, and each fresh interpreter imports torch and Megatron Core
again (about 6 s of CPU): nine of them side by side on two cores were most of a fixture's 35 s.
Here one interpreter imports them, then forks a child per run, at most one per core at once
(tests/hang.py). A child has run no torch op and started no thread before the fork, so it starts
as a fresh interpreter would after those imports (tests/dist/fork_server.py forks ranks so).

`run_forked` is what a test calls; this module run as `python -m tests.forked SPEC` is the
interpreter that forks.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from tests.hang import HANG_S, cores

REPO = Path(__file__).resolve().parents[1]


def run_forked(target: str, runs: dict[str, list]) -> dict[str, object]:
    """`target` ("module:function", a function that prints one JSON line last) called with each
    run's arguments in a process of its own; each run's JSON line, by the run's key."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "tests.forked", json.dumps({"target": target, "runs": runs})],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"forked runs of {target} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _preload(module: str):
    """What every child would import: torch, Megatron Core's parallel state and models, and the
    target's module (none of them starts a thread or runs a torch op)."""
    import torch  # noqa: F401
    from megatron.core import parallel_state  # noqa: F401
    from megatron.core.models.gpt import GPTModel  # noqa: F401

    return importlib.import_module(module)


def _child(function, args: list, out: Path) -> None:
    """In the forked child: stdout and stderr to files, the call, then out without the parent's
    exit handlers."""
    code = 1
    try:
        for fd, path in ((1, out), (2, out.with_suffix(".err"))):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        function(*args)
        code = 0
    except BaseException:  # the parent reports it with the child's stderr
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork_all(function, runs: dict[str, list], folder: Path) -> dict[str, object]:
    pending, running, found = list(runs.items()), {}, {}
    while pending or running:
        while pending and len(running) < cores():
            key, args = pending.pop(0)
            out = folder / f"run{len(found) + len(running)}.out"
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(function, args, out)
            running[pid] = (key, out)
        pid, status = os.wait()
        key, out = running.pop(pid)
        lines = out.read_text().strip().splitlines()
        if status != 0 or not lines:
            error = out.with_suffix(".err").read_text()[-3000:]
            raise RuntimeError(f"run {key!r} failed (wait status {status}):\n{error}")
        found[key] = json.loads(lines[-1])
    return found


def main(spec: str) -> None:
    values = json.loads(spec)
    module, name = values["target"].split(":")
    function = getattr(_preload(module), name)
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(_fork_all(function, values["runs"], Path(folder))))


if __name__ == "__main__":
    main(sys.argv[1])

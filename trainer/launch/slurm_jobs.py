"""What Slurm says about a job we submitted: its refusal, and its state.

A refused `sbatch` reaches NeMo-Run as `invoke`'s `UnexpectedExit` carrying Slurm's own stderr
(`sbatch: error: invalid partition specified: nope`); `sbatch_message` turns it into the words a
user acts on. A job's state comes from `sacct` where the cluster keeps accounting (it knows
finished and requeued jobs for good); without slurmdbd `sacct` answers "Slurm accounting storage
is disabled" and NeMo-Run's own status query says UNKNOWN, so the state then comes from `squeue`
while the job is queued or running, and from `scontrol show job` once it has left the queue
(the controller keeps it for `MinJobAge` seconds).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
UNKNOWN = "UNKNOWN"


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(list(argv), 127, "", str(err))


def sbatch_message(error: BaseException) -> str | None:
    """Slurm's reason from a failed submit (the `sbatch: error:` lines, joined), or None when
    `error` is not a command that failed."""
    result = getattr(error, "result", None)
    stderr = getattr(result, "stderr", None)
    if result is None or not isinstance(stderr, str):
        return None
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    reasons = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line]
    if reasons:
        return "; ".join(dict.fromkeys(reasons))
    exited = getattr(result, "exited", None)
    return lines[-1] if lines else f"{getattr(result, 'command', 'sbatch')} exited {exited}"


def job_id_of(handle: str) -> str:
    """The Slurm job id in a NeMo-Run handle (`slurm_tunnel://nemo_run/1234`)."""
    return handle.rstrip("/").rsplit("/", 1)[-1]


def _from_sacct(job_id: str, run: Runner) -> str | None:
    result = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    if result.returncode != 0 or "disabled" in result.stderr + result.stdout:
        return None
    states = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    return states[-1] if states else None


def _from_squeue(job_id: str, run: Runner) -> str | None:
    result = run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    state = result.stdout.strip() if result.returncode == 0 else ""
    return state.split()[0] if state else None


def _from_scontrol(job_id: str, run: Runner) -> str | None:
    result = run(["scontrol", "show", "job", job_id])
    found = re.search(r"\bJobState=(\S+)", result.stdout) if result.returncode == 0 else None
    return found.group(1) if found else None


def job_state(job_id: str, run: Runner = _run) -> tuple[str, str]:
    """(state, where it came from): sacct with accounting, else squeue, else scontrol."""
    for source, ask in (("sacct", _from_sacct), ("squeue", _from_squeue),
                        ("scontrol", _from_scontrol)):
        state = ask(job_id, run)
        if state:
            return state, source
    return UNKNOWN, "no record: accounting is off and the controller has forgotten it"

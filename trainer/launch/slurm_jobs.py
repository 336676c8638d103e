"""What Slurm says about a job we submitted: its refusal, and its state.

A refused `sbatch` reaches NeMo-Run as `invoke`'s `UnexpectedExit` carrying Slurm's own stderr
(`sbatch: error: invalid partition specified: nope`); `sbatch_message` turns it into the words a
user acts on, and `submit_failure_line` tells a refusal from a machine without sbatch and from a
controller sbatch cannot reach.

A job's state comes from `sacct` where the cluster keeps accounting (it knows finished and
requeued jobs for good); without slurmdbd `sacct` answers "Slurm accounting storage is
disabled" and NeMo-Run's own status query says UNKNOWN, so the state then comes from `squeue`
while the job is queued or running, and from `scontrol show job` once it has left the queue
(the controller keeps it for `MinJobAge` seconds).

A job's own steps ask too (`job_view`, from the torchrun agent): when Slurm sends them SIGTERM,
`scontrol show job` and `sinfo` say why (`stop_reason`): the restart count has grown (requeued:
`scontrol requeue`, preemption, or a node Slurm lost, which `sinfo` marks `down*`/`*`), the job
still runs (only its steps were signalled: `scancel --signal=TERM`), its run time reached its
limit, or else it was cancelled. While the job is ending `scontrol` shows COMPLETING, not the
final state, hence these clues. Measured on Slurm 22.05 with two slurmd on one host.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
UNKNOWN = "UNKNOWN"


def slurm_command(argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
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


NO_SBATCH = re.compile(r"sbatch: (command )?not found|No such file or directory: '?sbatch")
# Slurm's words when sbatch cannot reach the controller (a down slurmctld, or configless Slurm
# whose DNS SRV record is missing): no partition or account of ours is at fault then.
UNREACHABLE = ("unable to contact slurm controller", "dns srv lookup failed",
               "could not establish a configuration source", "failed to fetch config")


def submit_failure_line(error: BaseException) -> str | None:
    """The one line for a failed submit, or None when `error` is not a failed command. Three
    causes need three fixes, so they are told apart: no sbatch here (the shell's "command not
    found", exit 127: a laptop or a compute image, not a login node), a controller sbatch
    cannot reach (nothing in the job is wrong), and Slurm refusing the job (its own words)."""
    reason = sbatch_message(error)
    if reason is None:
        return None
    result = getattr(error, "result", None)
    stderr = getattr(result, "stderr", "") or ""
    if getattr(result, "exited", None) == 127 or NO_SBATCH.search(stderr):
        return ("no sbatch on this machine; launch from a Slurm login node, or print the job "
                "with --dry-run, or use executor=local")
    if any(marker in stderr.lower() for marker in UNREACHABLE):
        return (f"sbatch cannot reach the Slurm controller: {reason} (Slurm's words); check "
                "that slurmctld is up and this machine's Slurm configuration (scontrol ping, "
                "SLURM_CONF), or print the job with --dry-run")
    return (f"sbatch refused the job: {reason} (Slurm's words; check partition=, account=, "
            "time= and the cluster file against sinfo)")


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


def job_state(job_id: str, run: Runner = slurm_command) -> tuple[str, str]:
    """(state, where it came from): sacct with accounting, else squeue, else scontrol."""
    for source, ask in (("sacct", _from_sacct), ("squeue", _from_squeue),
                        ("scontrol", _from_scontrol)):
        state = ask(job_id, run)
        if state:
            return state, source
    return UNKNOWN, "no record: accounting is off and the controller has forgotten it"


@dataclass(frozen=True)
class JobView:
    """A running job as its own steps see it in Slurm: enough to say why they were stopped."""

    state: str  # JobState now (COMPLETING while the job's processes end)
    restarts: int  # Restarts now; above the attempt's SLURM_RESTART_COUNT: requeued
    timed_out: bool  # RunTime has reached TimeLimit
    lost_nodes: tuple[str, ...] = ()  # nodes of the allocation Slurm sees down or not responding


def slurm_seconds(text: str) -> float | None:
    """Seconds in Slurm's `[D-]HH:MM:SS` / `MM:SS` time; None for UNLIMITED or anything else."""
    found = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not found:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _lost_nodes(nodelist: str, run: Runner) -> tuple[str, ...]:
    if not nodelist:
        return ()
    result = run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N %T"])
    pairs = [line.split() for line in result.stdout.splitlines()] if result.returncode == 0 else []
    return tuple(sorted({pair[0] for pair in pairs if len(pair) == 2 and (
        pair[1].endswith("*") or pair[1].startswith(("down", "fail")))}))


def job_view(job_id: str, nodelist: str = "", run: Runner = slurm_command) -> JobView | None:
    """The job's state, restart count and time from `scontrol show job`, and the nodes of its
    allocation (`nodelist`, a Slurm host list) Slurm has lost; None when Slurm cannot say."""
    result = run(["scontrol", "show", "job", "-o", job_id])
    fields = dict(re.findall(r"\b(\w+)=(\S*)", result.stdout)) if result.returncode == 0 else {}
    if "JobState" not in fields or not fields.get("Restarts", "").isdigit():
        return None
    ran, limit = (slurm_seconds(fields.get(key, "")) for key in ("RunTime", "TimeLimit"))
    return JobView(fields["JobState"], int(fields["Restarts"]),
                   ran is not None and limit is not None and ran >= limit,
                   _lost_nodes(nodelist, run))


def stop_reason(view: JobView | None, attempt: int) -> str | None:
    """Why Slurm stopped attempt `attempt` (its SLURM_RESTART_COUNT) of the job, in a few words;
    None when Slurm could not be asked."""
    if view is None:
        return None
    requeued = view.restarts > attempt
    if view.lost_nodes:
        then = "requeued the job" if requeued else "ended the job"
        return (f"Slurm lost {', '.join(view.lost_nodes)} (it stopped answering: its slurmd or "
                f"the node is down) and {then}")
    if requeued:
        return f"Slurm requeued the job (restart {view.restarts}: scontrol requeue or preemption)"
    if view.state == "RUNNING":
        return ("only the job's steps were signalled (scancel --signal=TERM): the job ends, "
                "not requeued")
    if view.timed_out:
        return "the job reached its time limit"
    return "the job was cancelled (scancel)"


def ended_by_slurm(view: JobView | None, attempt: int) -> bool:
    """Slurm itself is ending attempt `attempt` (requeued, cancelled, a lost node): a rank that
    fails now fails because of that, and the attempt is no failure of the run."""
    return view is not None and (view.restarts > attempt or view.state != "RUNNING")

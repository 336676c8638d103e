"""What Slurm says about a submit, read as trainer/launch/slurm_jobs.py reads it: a refusal's
own words from invoke's failure, a job's state from sacct, else squeue, else scontrol, and why
Slurm stopped a job's steps, from the job's own view (the scontrol lines are Slurm 22.05's)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from trainer.launch.slurm_jobs import (
    JobView,
    ended_by_slurm,
    job_id_of,
    job_state,
    job_view,
    sbatch_message,
    slurm_seconds,
    stop_reason,
)


def _failed(stderr: str) -> Exception:
    error = RuntimeError("Encountered a bad command exit code!")
    error.result = SimpleNamespace(stderr=stderr, exited=1, command="sbatch x.sh")
    return error


def test_a_refused_sbatch_is_slurms_own_words():
    stderr = ("sbatch: error: invalid partition specified: nope\n"
              "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    assert sbatch_message(_failed(stderr)) == (
        "invalid partition specified: nope; Batch job submission failed: Invalid partition "
        "name specified")
    assert sbatch_message(_failed("bash: sbatch: command not found\n")) == \
        "bash: sbatch: command not found"
    assert sbatch_message(_failed("")) == "sbatch x.sh exited 1"
    assert sbatch_message(ValueError("not a command")) is None


def _answers(table: dict[str, tuple[int, str, str]]):
    def run(argv):
        code, out, err = table.get(argv[0], (1, "", f"{argv[0]}: not here"))
        return subprocess.CompletedProcess(argv, code, out, err)
    return run


def test_state_comes_from_sacct_where_accounting_exists():
    run = _answers({"sacct": (0, "REQUEUED\nCOMPLETED\n", ""), "squeue": (0, "RUNNING\n", "")})
    assert job_state("7", run) == ("COMPLETED", "sacct")


def test_without_accounting_state_comes_from_squeue_then_scontrol():
    disabled = (1, "", "Slurm accounting storage is disabled\n")
    assert job_state("7", _answers({"sacct": disabled, "squeue": (0, "PENDING\n", "")})) == \
        ("PENDING", "squeue")
    gone = _answers({"sacct": disabled, "squeue": (0, "", ""),
                     "scontrol": (0, "JobId=7 JobName=x\n   JobState=FAILED Reason=None\n", "")})
    assert job_state("7", gone) == ("FAILED", "scontrol")
    state, source = job_state("7", _answers({"sacct": disabled}))
    assert state == "UNKNOWN" and "accounting is off" in source


def test_the_job_id_is_the_last_part_of_nemo_runs_handle():
    assert job_id_of("slurm_tunnel://nemo_run/1234") == "1234"


# `scontrol show job -o` on the first node while Slurm requeued a job after losing node2
REQUEUED_JOB = ("JobId=1 JobName=job.sh UserId=root(0) JobState=COMPLETING Reason=None "
                "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 RunTime=00:00:31 "
                "TimeLimit=04:00:00 NodeList=node1 BatchHost=node1 NumNodes=1\n")


def test_the_job_view_reads_scontrol_and_the_nodes_slurm_lost():
    run = _answers({"scontrol": (0, REQUEUED_JOB, ""),
                    "sinfo": (0, "node1 completing\nnode2 down*\n", "")})
    assert job_view("1", "node[1-2]", run) == JobView("COMPLETING", 1, False, ("node2",))
    assert job_view("1", "", run) == JobView("COMPLETING", 1, False, ())  # no node list asked
    assert job_view("1", "node[1-2]", _answers({})) is None  # scontrol cannot say
    timed_out = REQUEUED_JOB.replace("RunTime=00:00:31", "RunTime=04:00:00")
    assert job_view("1", "", _answers({"scontrol": (0, timed_out, "")})).timed_out


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:00:31", 31.0), ("04:00:00", 14400.0), ("1-02:00:00", 93600.0), ("05:07", 307.0),
    ("UNLIMITED", None), ("", None)])
def test_slurm_times_read_as_seconds(text, seconds):
    assert slurm_seconds(text) == seconds


@pytest.mark.parametrize(("view", "reason"), [
    (JobView("COMPLETING", 2, False, ("node2",)), "Slurm lost node2 (it stopped answering: its "
     "slurmd or the node is down) and requeued the job"),
    (JobView("COMPLETING", 1, False, ("node2",)), "Slurm lost node2 (it stopped answering: its "
     "slurmd or the node is down) and ended the job"),
    (JobView("COMPLETING", 2, False), "Slurm requeued the job (restart 2: scontrol requeue or "
     "preemption)"),
    (JobView("RUNNING", 1, False), "only the job's steps were signalled (scancel --signal=TERM): "
     "the job ends, not requeued"),
    (JobView("COMPLETING", 1, True), "the job reached its time limit"),
    (JobView("COMPLETING", 1, False), "the job was cancelled (scancel)"),
    (None, None)])
def test_why_slurm_stopped_attempt_1(view, reason):
    assert stop_reason(view, attempt=1) == reason


def test_an_attempt_slurm_is_ending_is_no_failure_of_the_run():
    assert not ended_by_slurm(JobView("RUNNING", 1, False), attempt=1)  # a rank died: a failure
    assert not ended_by_slurm(None, attempt=0)  # Slurm cannot say: count it
    assert ended_by_slurm(JobView("PENDING", 2, False), attempt=1)  # requeued meanwhile
    assert ended_by_slurm(JobView("COMPLETING", 1, False, ("node2",)), attempt=1)

"""What Slurm says about a submit, read as trainer/launch/slurm_jobs.py reads it: a refusal's
own words from invoke's failure, and a job's state from sacct, else squeue, else scontrol."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from trainer.launch.slurm_jobs import job_id_of, job_state, sbatch_message


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

"""`scripts/launch.py ... executor=slurm` for real, on the session's Slurm (two nodes on this host).

A one-node job (2 CPU ranks on one node) and a two-node job (one rank on each) are submitted
through the launcher as a user would, with the CPU cluster file (no GPU request, 2 CPUs per
node's torchrun), while the same run trains locally; both jobs train to the end and their
per-step losses, grad norms and learning rates equal the local run's bit for bit. A third job
is requeued by hand (`scontrol requeue`) mid-run: it resumes from its newest checkpoint, ends
equal to the local run with every step in metrics.jsonl once, and keeps its `retries=1`. A
refused submit is one line with Slurm's own words. The jobs run side by side (each node
declares room for all three), so the module costs about one job's time plus the requeue's
wait (the credential lifetime, `CRED_EXPIRE`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.launch.slurm_jobs import job_state

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CPU_CLUSTER = REPO / "conf" / "cluster" / "cpu_slurm_2x2.yaml"
STEPS = 24
RUN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
       f"train.train_iters={STEPS}", "scheduler.warmup_iters=1", "train.eval_iters=0",
       "train.eval_interval=0", "logging.progress_bar=false", "plugins.logging.loss_curve=false",
       "checkpoint.save_interval=4"]
REQUEUE_AFTER_STEP = 6
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")
JOB_TIMEOUT_S = 420


def launch(slurm, job_dir: Path, cluster: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(REPO / "scripts" / "launch.py"), *RUN, f"cluster={cluster}",
            f"job_dir={job_dir}", *extra]
    return subprocess.run(argv, env={**slurm.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=180, check=False)


def submitted(result: subprocess.CompletedProcess) -> tuple[str, Path]:
    """(job id, run directory) from what a successful submit printed."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = re.search(r"^submitted Slurm job (\d+): ", result.stdout, re.M)
    run_dir = re.search(r"^run directory: (\S+)", result.stdout, re.M)
    assert job and run_dir, result.stdout[-3000:]
    return job.group(1), Path(run_dir.group(1))


def wait_for(slurm, job: str, timeout: float = JOB_TIMEOUT_S) -> str:
    """The job's final state, polled as the launcher reads it (sacct, else squeue/scontrol)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, _ = job_state(job, run=lambda argv: slurm.run(*argv, check=False))
        if state in FINISHED:
            return state
        time.sleep(1.0)
    raise AssertionError(f"job {job} still {state} after {timeout:.0f} s")


def train_records(run_dir: Path) -> list[tuple[int, float, float, float]]:
    """(step, loss, grad norm, lr) of every train record, in file order."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records
            if r["kind"] == "train"]


def requeue_mid_run(slurm, job: str, run_dir: Path) -> int:
    """`scontrol requeue` once the job has trained past REQUEUE_AFTER_STEP; the step it had."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        steps = [record[0] for record in train_records(run_dir)]
        if steps and steps[-1] >= REQUEUE_AFTER_STEP:
            slurm.run("scontrol", "requeue", job)
            return steps[-1]
        time.sleep(0.1)
    raise AssertionError(f"job {job} never reached step {REQUEUE_AFTER_STEP}")


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """Three jobs submitted side by side (one node, two nodes, one node requeued mid-run by
    hand with retries=1), the local run beside them, all finished."""
    tmp = tmp_path_factory.mktemp("slurm_jobs")
    one_rank_per_node = tmp / "cpu_slurm_2x1.yaml"
    one_rank_per_node.write_text(CPU_CLUSTER.read_text().replace(
        "gpus_per_node: 2", "gpus_per_node: 1"))
    local_dir = tmp / "local"
    local = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), *RUN, f"run_dir={local_dir}"],
        env={**slurm.env, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    found = {"one": submitted(launch(slurm, tmp / "jobs", CPU_CLUSTER)),
             "two": submitted(launch(slurm, tmp / "jobs", one_rank_per_node)),
             "requeued": submitted(launch(slurm, tmp / "jobs", CPU_CLUSTER, "retries=1"))}
    requeued_at = requeue_mid_run(slurm, *found["requeued"])
    output, _ = local.communicate(timeout=JOB_TIMEOUT_S)
    assert local.returncode == 0, output[-3000:]
    states = {name: wait_for(slurm, job) for name, (job, _) in found.items()}
    return {"local": local_dir, "requeued_at": requeued_at, "tmp": tmp,
            **{name: (*found[name], states[name]) for name in found}}


@pytest.mark.parametrize("which", ["one", "two", "requeued"])
def test_a_job_trains_to_the_end_with_the_local_runs_figures_bit_for_bit(jobs, which):
    job, run_dir, state = jobs[which]
    assert state == "COMPLETED"
    records = train_records(run_dir)
    assert [record[0] for record in records] == list(range(1, STEPS + 1))  # each step once
    assert records == train_records(jobs["local"])  # floats from JSON: exact equality
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{STEPS:07d}"


def test_a_requeued_job_resumes_from_its_newest_checkpoint_keeping_its_retry(jobs, slurm):
    job, run_dir, _ = jobs["requeued"]
    [restarts] = re.findall(r"Restarts=(\d+)", slurm.run("scontrol", "show", "job", job).stdout)
    assert restarts == "1"
    logs = sorted(jobs["tmp"].glob(f"jobs/experiments/*/*/pretrain/log-mcore-pretrain_{job}_*"))
    first, second = (path.read_text() for path in logs)
    assert "got SIGTERM and stopped its ranks" in first  # the requeue, in one line
    resumed = int(re.search(r"resume: resuming from \S+/step_(\d+) \(step ", second).group(1))
    # The newest checkpoint when the requeue struck (save_interval=4; it struck after step 6)
    assert resumed % 4 == 0 and jobs["requeued_at"] - 4 < resumed < STEPS
    pattern = f"jobs/experiments/*/*/pretrain/sbatch_mcore-pretrain_{job}.out"
    [sbatch_log] = jobs["tmp"].glob(pattern)
    allowances = re.findall(r"^\+ export TORCHX_MAX_RETRIES=(\d+)$", sbatch_log.read_text(), re.M)
    assert allowances[-2:] == ["1", "2"]  # the requeue did not use up retries=1
    assert not (run_dir / "slurm_failed_attempts").exists()


def test_a_refused_submit_is_one_line_with_slurms_words(slurm, tmp_path):
    result = launch(slurm, tmp_path, CPU_CLUSTER, "partition=nope")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: sbatch refused the job: invalid partition specified: nope; Batch job "
        "submission failed: Invalid partition name specified (Slurm's words; check "
        "partition=, account=, time= and the cluster file against sinfo)"]
    assert "Traceback" not in result.stdout + result.stderr

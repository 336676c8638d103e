"""`scripts/launch.py ... executor=slurm` for real, on the session's Slurm (two nodes on this host).

A one-node job (2 CPU ranks on one node) and a two-node job (one rank on each) are submitted
through the launcher as a user would, with the CPU cluster file (no GPU request, 2 CPUs per
node's torchrun), while the same run trains locally; both jobs train to the end and their
per-step losses equal the local run's bit for bit. A refused submit is one line with Slurm's
own words. The jobs run side by side (each node declares room for both), so the module costs
about one job's time.
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
RUN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
       "train.train_iters=6", "scheduler.warmup_iters=1", "train.eval_iters=0",
       "train.eval_interval=0", "logging.progress_bar=false", "plugins.logging.loss_curve=false"]
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


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """Both jobs submitted, the local run beside them, all finished."""
    tmp = tmp_path_factory.mktemp("slurm_jobs")
    one_rank_per_node = tmp / "cpu_slurm_2x1.yaml"
    one_rank_per_node.write_text(CPU_CLUSTER.read_text().replace(
        "gpus_per_node: 2", "gpus_per_node: 1"))
    local_dir = tmp / "local"
    local = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), *RUN, f"run_dir={local_dir}"],
        env={**slurm.env, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    one = submitted(launch(slurm, tmp / "jobs", CPU_CLUSTER))
    two = submitted(launch(slurm, tmp / "jobs", one_rank_per_node))
    output, _ = local.communicate(timeout=JOB_TIMEOUT_S)
    assert local.returncode == 0, output[-3000:]
    return {"local": local_dir, "one": (*one, wait_for(slurm, one[0])),
            "two": (*two, wait_for(slurm, two[0]))}


@pytest.mark.parametrize("which", ["one", "two"])
def test_a_job_trains_to_the_end_with_the_local_runs_losses_bit_for_bit(jobs, which):
    job, run_dir, state = jobs[which]
    assert state == "COMPLETED"
    losses = train_losses(run_dir)
    assert [step for step, _ in losses] == list(range(1, 7))
    assert losses == train_losses(jobs["local"])  # floats from JSON: exact equality
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_0000006"


def test_a_refused_submit_is_one_line_with_slurms_words(slurm, tmp_path):
    result = launch(slurm, tmp_path, CPU_CLUSTER, "partition=nope")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: sbatch refused the job: invalid partition specified: nope; Batch job "
        "submission failed: Invalid partition name specified (Slurm's words; check "
        "partition=, account=, time= and the cluster file against sinfo)"]
    assert "Traceback" not in result.stdout + result.stderr

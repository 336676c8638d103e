"""`scripts/launch.py ... executor=slurm` for real, on the session's Slurm (two nodes on this host).

Four jobs are submitted side by side through the launcher as a user would (the script's own
command lines, all in one interpreter: tests/slurm/launch_many.py), with the CPU cluster file (no
GPU request, 2 CPUs per node's torchrun), and each meets its faults while it runs; the same
16-step run trains locally, the reference:

- two nodes (one rank on each), `retries=1`: `scontrol requeue` by hand mid-run, then node2 lost
  in the next attempt (its slurmd killed and the job's processes there stopped, as a dead node
  leaves them). Each attempt ends in one line naming what Slurm did, resumes from its newest
  checkpoint, uses up no retry, and the job ends equal to the local run bit for bit, each step
  once in metrics.jsonl.
- one node (2 ranks, partition `first`: node1 alone, so node2's loss spares it), `retries=1`:
  rank 1 killed by SIGKILL mid-run. Named in one line, counted as the one failure `retries=1`
  allows, retried, and the job ends equal to the local run.
- one node, `scancel --signal=TERM` once its ranks run: one line, the job FAILED, not requeued
  although `retries=1`.
- one node, plain `scancel` once its ranks run: one line, the job CANCELLED.
- one node in a partition that holds it until the data its blend names, there when the
  launcher checked it, is gone: the job's first step (`pretrain.py check=paths`) names it in
  one line and the job ends with exit code 2, before any rank starts, not requeued.

The one-node jobs take their partition from the cluster file (a site setting). A refused submit
is one line with Slurm's own words (the command line's partition over the cluster file's). Job
states are read as the launcher reads them (sacct, else squeue and scontrol). Everything runs
at once, so the module costs about the two-node job's chain: two requeue waits (the credential
lifetime) and the time Slurm takes to set a silent node down (`SLURMD_TIMEOUT` and
`MESSAGE_TIMEOUT`), during which the local run trains.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from tests.hang import HANG_S
from tests.slurm.local_slurm import FIRST_ONLY, HELD, job_processes, process_states
from trainer.launch.slurm_jobs import job_state

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CPU_CLUSTER = REPO / "conf" / "cluster" / "cpu_slurm_2x2.yaml"
STEPS, SAVE_INTERVAL = 16, 4
RUN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
       f"train.train_iters={STEPS}", "scheduler.warmup_iters=1", "train.eval_iters=0",
       "train.eval_interval=0", "logging.progress_bar=false", "plugins.logging.loss_curve=false",
       f"checkpoint.save_interval={SAVE_INTERVAL}"]
REQUEUE_AT, LOSE_NODE_AT, KILL_RANK_AT = 5, 10, 5  # steps reached before each fault
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")
JOB_TIMEOUT_S = HANG_S  # a safety net for a hung job, not a speed limit


def launch_args(job_dir: Path, cluster: Path, *extra: str) -> list[str]:
    return [*RUN, f"cluster={cluster}", f"job_dir={job_dir}", *extra]


def launch_all(slurm, commands: list[list[str]]) -> subprocess.Popen:
    """`scripts/launch.py` with each command line, one after another in one interpreter
    (tests/slurm/launch_many.py): one JSON line per launch on stdout as each ends."""
    return subprocess.Popen([sys.executable, "-m", "tests.slurm.launch_many", json.dumps(commands)],
                            env={**slurm.env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                            stdout=subprocess.PIPE, text=True)


def launched(launcher: subprocess.Popen) -> subprocess.CompletedProcess:
    """The next launch's exit code, stdout and stderr."""
    line = launcher.stdout.readline()
    assert line, f"the launches ended early (exit {launcher.wait(timeout=HANG_S)})"
    result = json.loads(line)
    return subprocess.CompletedProcess("launch.py", result["returncode"], result["stdout"],
                                       result["stderr"])


def submitted(result: subprocess.CompletedProcess) -> tuple[str, Path]:
    """(job id, run directory) from what a successful submit printed."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = re.search(r"^submitted Slurm job (\d+): ", result.stdout, re.M)
    run_dir = re.search(r"^run directory: (\S+)", result.stdout, re.M)
    assert job and run_dir, result.stdout[-3000:]
    return job.group(1), Path(run_dir.group(1))


def until(ready, what: str, timeout: float = JOB_TIMEOUT_S, every: float = 0.1, why=None):
    """`ready()` once it is true; else, after `timeout`, an error that says what is missing
    (and `why()`: what the job was doing instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"no {what} after {timeout:.0f} s" + (f": {why()}" if why else ""))


def wait_for(slurm, job: str) -> str:
    """The job's final state, polled as the launcher reads it (sacct, else squeue/scontrol)."""
    def final():
        state, _ = job_state(job, run=lambda argv: slurm.run(*argv, check=False))
        return state if state in FINISHED else None
    return until(final, f"end of job {job}", every=1.0)


def restarts(slurm, job: str) -> int:
    found = re.search(r"Restarts=(\d+)", slurm.run("scontrol", "show", "job", job).stdout)
    return int(found.group(1))


def train_records(run_dir: Path) -> list[tuple[int, float, float, float]]:
    """(step, loss, grad norm, lr) of every whole train record, in file order."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # a line being written
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records
            if r["kind"] == "train"]


def reached(run_dir: Path, step: int) -> int:
    """Wait until the run has logged `step`; the last step logged."""
    def last():
        records = train_records(run_dir)
        return records[-1][0] if records and records[-1][0] >= step else None
    return until(last, f"step {step} in {run_dir}")


def requeue_then_lose_node2(slurm, job: str, run_dir: Path, job_dir: Path,
                            while_down=lambda: None) -> dict:
    """`scontrol requeue` by hand, then node2 lost in the next attempt (`while_down()` called
    then: the job waits for Slurm to notice and for its requeue, its ranks idle); the job's
    end."""
    requeued_at = reached(run_dir, REQUEUE_AT)
    slurm.run("scontrol", "requeue", job)
    until(lambda: restarts(slurm, job) >= 1, "first requeue")
    # node2 is lost while the second attempt's ranks train (not while its agents meet: steps
    # the first attempt logged past its checkpoint may already be there)
    until(lambda: "resume: resuming from" in attempt_log(job_dir, job, 1), "the second attempt")
    lost_at = reached(run_dir, LOSE_NODE_AT)
    slurm.lose_node("node2", job)
    while_down()
    until(lambda: restarts(slurm, job) >= 2, "the requeue after node2 was set down", every=0.5)
    on_node1 = process_states(job_processes(job, SLURMD_NODENAME="node1"))  # as Slurm stops them
    until(lambda: "got SIGTERM" in attempt_log(job_dir, job, 1), "node1's agent's line",
          why=lambda: (f"job {job}'s processes on node1 at the requeue: {on_node1}; "
                       f"attempt 1's log ends: {attempt_log(job_dir, job, 1)[-1500:]}"))
    slurm.start_slurmd("node2")  # back in service (ReturnToService=2) for the third attempt
    return {"requeued_at": requeued_at, "lost_at": lost_at, "state": wait_for(slurm, job)}


def kill_rank_1(slurm, job: str, run_dir: Path, job_dir: Path) -> dict:
    killed_at = reached(run_dir, KILL_RANK_AT)
    pids = until(lambda: job_processes(job, RANK="1"), "rank 1's process")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return {"killed_at": killed_at, "state": wait_for(slurm, job)}


def cancel(*how: str):
    """`scancel HOW` once the job's torchrun has started its ranks (their training adds nothing
    to what the cancel shows)."""
    def act(slurm, job: str, run_dir: Path, job_dir: Path) -> dict:
        until(lambda: job_processes(job, RANK="1"), "the job's ranks")
        slurm.run("scancel", *how, job)
        return {"state": wait_for(slurm, job)}
    return act


def data_gone_before_it_runs(slurm, job: str, run_dir: Path, job_dir: Path) -> dict:
    """The job waits in the DOWN partition while the data its blend names, there at submit,
    goes away; then it may run: its first step finds the manifest gone."""
    until(lambda: job_state(job, run=lambda argv: slurm.run(*argv, check=False))[0] == "PENDING",
          "the job pending in the held partition")
    shutil.rmtree(job_dir / "data")
    slurm.run("scontrol", "update", f"PartitionName={HELD}", "State=UP")
    return {"state": wait_for(slurm, job)}


def prepared_blend(folder: Path) -> str:
    """A blend of one manifest of a real dataset in `folder`/data (the run reads 256 ids)."""
    from tests.unit.dataset_fixtures import write_dataset

    data = folder / "data"
    data.mkdir(parents=True)
    write_dataset(data / "web_0", [[1, 2, 0]] * 40)
    (data / "web.json").write_text('{"eod_id": 0, "vocab_size": 256, '
                                   '"shards": [{"prefix": "web_0"}]}')
    blend = folder / "web.yaml"
    blend.write_text(f"train:\n  - {{manifest: {data / 'web.json'}}}\n")
    return str(blend)


SCENARIOS = {  # name: (cluster file, launch options, the fault acted out while it runs)
    "two": ("one rank per node", ["retries=1"], requeue_then_lose_node2),
    "killed": ("first", ["retries=1"], kill_rank_1),
    "term": ("first", ["retries=1"], cancel("--signal=TERM")),
    "cancelled": ("first", [], cancel()),
    "data_gone": ("two ranks per node", [f"partition={HELD}", "data.source=blend"],
                  data_gone_before_it_runs)}


def train_locally(slurm, run_dir: Path) -> subprocess.Popen:
    """The same run on this machine, without Slurm: the reference."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "pretrain.py"), *RUN, f"run_dir={run_dir}"],
        env={**slurm.env, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """The five jobs and a refused submit started side by side; each job's fault acted out on
    its own thread; all finished. The local run starts once node2 is lost, the two-node job's
    longest wait (its ranks idle until Slurm sets the node down and requeues the job), not
    beside the jobs' start-up, which already keeps both cores busy."""
    tmp = tmp_path_factory.mktemp("slurm_jobs")
    clusters = {"one rank per node": tmp / "cpu_slurm_2x1.yaml",
                "first": tmp / "cpu_slurm_first.yaml", "two ranks per node": CPU_CLUSTER}
    clusters["one rank per node"].write_text(CPU_CLUSTER.read_text().replace(
        "gpus_per_node: 2", "gpus_per_node: 1"))
    # the site's partition in the cluster file: jobs kept on node1 (node2's loss spares them)
    clusters["first"].write_text(CPU_CLUSTER.read_text() + f"partition: {FIRST_ONLY}\n")
    blend = prepared_blend(tmp / "data_gone")
    names = list(SCENARIOS)  # the two-node job first: its chain of faults is the longest
    launcher = launch_all(slurm, [
        *(launch_args(tmp / name, clusters[SCENARIOS[name][0]], *SCENARIOS[name][1],
                      *([f"data.blend={blend}"] if name == "data_gone" else []))
          for name in names),
        # the command line's partition wins over the cluster file's
        launch_args(tmp / "refused", clusters["first"], "partition=nope")])
    found, futures, local, local_dir = {}, {}, [], tmp / "local"
    acts = {**{name: SCENARIOS[name][2] for name in names},
            "two": partial(requeue_then_lose_node2,
                           while_down=lambda: local.append(train_locally(slurm, local_dir)))}
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        for name in names:  # each job's fault is acted out as soon as it is submitted
            found[name] = (*submitted(launched(launcher)), tmp / name)
            futures[name] = pool.submit(acts[name], slurm, *found[name])
        refused = launched(launcher)
        launcher.wait(timeout=HANG_S)
        outcomes = {name: future.result() for name, future in futures.items()}
    [local] = local
    output, _ = local.communicate(timeout=JOB_TIMEOUT_S)
    assert local.returncode == 0, output[-3000:]
    return {"local": local_dir, "refused": refused,
            **{name: {"job": found[name][0], "run_dir": found[name][1],
                      "job_dir": found[name][2], **outcomes[name]} for name in SCENARIOS}}


def attempt_log(job_dir: Path, job: str, attempt: int) -> str:
    """The log of the job's torchruns in one attempt ("" before it exists)."""
    paths = list(job_dir.glob(f"experiments/*/*/pretrain/log-mcore-pretrain_{job}_{attempt}.out"))
    return paths[0].read_text() if paths else ""


def log_of(job: dict, attempt: int) -> str:
    return attempt_log(job["job_dir"], job["job"], attempt)


def our_lines(log: str) -> list[str]:
    """The launcher's and agent's `error:` lines (not Slurm's, not the ranks' prefixed ones)."""
    return [line for line in log.splitlines() if line.startswith("error:")]


def last_allowance(job: dict) -> int:
    """TORCHX_MAX_RETRIES as the last attempt's sbatch script raised it (its log is that
    attempt's: Slurm rewrites it at each start)."""
    return int(re.findall(r"^\+ export TORCHX_MAX_RETRIES=(\d+)$", sbatch_log(job), re.M)[-1])


def sbatch_log(job: dict) -> str:
    [path] = job["job_dir"].glob(
        f"experiments/*/*/pretrain/sbatch_mcore-pretrain_{job['job']}.out")
    return path.read_text()


def resumed_step(log: str) -> int:
    return int(re.search(r"resume: resuming from \S+/step_(\d+) \(step ", log).group(1))


def newest_checkpoint_at(step: int) -> int:
    """The newest checkpoint surely whole once `step` was logged: a step's record comes before
    its save, which the next step waits for (so the save at `step` itself may be cut off)."""
    return (step - 1) // SAVE_INTERVAL * SAVE_INTERVAL


@pytest.mark.parametrize("which", ["two", "killed"])
def test_a_job_trains_to_the_end_with_the_local_runs_figures_bit_for_bit(jobs, which):
    job = jobs[which]
    assert job["state"] == "COMPLETED"
    records = train_records(job["run_dir"])
    assert [record[0] for record in records] == list(range(1, STEPS + 1))  # each step once
    assert records == train_records(jobs["local"])  # floats from JSON: exact equality
    assert (job["run_dir"] / "checkpoints" / "latest").read_text() == f"step_{STEPS:07d}"


def test_a_requeued_job_resumes_from_its_newest_checkpoint_keeping_its_retry(jobs):
    job = jobs["two"]
    log = log_of(job, 0)
    assert ("error: torchrun on node 0 got SIGTERM and stopped its ranks: Slurm requeued the job "
            "(restart 1: scontrol requeue or preemption)") in our_lines(log)
    assert "Traceback" not in log
    # the newest checkpoint when the requeue struck (steps may have run on before the TERM)
    assert newest_checkpoint_at(job["requeued_at"]) <= resumed_step(log_of(job, 1)) < STEPS


def test_a_lost_node_is_named_and_its_requeue_uses_no_retry(slurm, jobs):
    job = jobs["two"]
    lost = re.compile(r"error: torchrun on node [01] got SIGTERM and stopped its ranks: Slurm "
                      r"lost node2 \(it stopped answering: its slurmd or the node is down\) and "
                      r"requeued the job$")  # node: the rendezvous's rank of node1's torchrun
    assert any(lost.match(line) for line in our_lines(log_of(job, 1)))
    assert newest_checkpoint_at(job["lost_at"]) <= resumed_step(log_of(job, 2)) < STEPS
    assert restarts(slurm, job["job"]) == 2
    assert last_allowance(job) == 1 + 2  # retries=1, two restarts that were no failures
    assert not (job["run_dir"] / "slurm_failed_attempts").exists()


def test_a_killed_rank_is_named_and_retried_as_the_one_failure_retries_allow(slurm, jobs):
    job = jobs["killed"]
    log = log_of(job, 0)
    [line] = our_lines(log)  # rank 0 stopped by torchrun, or failing by itself first
    assert re.fullmatch(r"error: rank 1 \(node 0, local rank 1\) died: signal SIGKILL"
                        r"( \(torchrun then stopped 1 other rank of its node\))?", line), line
    assert "Traceback" not in log
    assert (job["run_dir"] / "slurm_failed_attempts").read_text() == "0\n"
    assert restarts(slurm, job["job"]) == 1
    assert last_allowance(job) == 1  # = the restart count: a second failure is not retried
    assert newest_checkpoint_at(job["killed_at"]) <= resumed_step(log_of(job, 1)) < STEPS


@pytest.mark.parametrize(("which", "state", "reason"), [
    ("term", "FAILED", "only the job's steps were signalled (scancel --signal=TERM): the job "
     "ends, not requeued"),
    ("cancelled", "CANCELLED", "the job was cancelled (scancel)")])
def test_a_cancelled_job_ends_in_one_line_and_is_not_retried(slurm, jobs, which, state, reason):
    job = jobs[which]
    assert job["state"] == state
    log = log_of(job, 0)
    assert our_lines(log) == [
        f"error: torchrun on node 0 got SIGTERM and stopped its ranks: {reason}"]
    assert "Traceback" not in log
    assert restarts(slurm, job["job"]) == 0
    assert not (job["run_dir"] / "slurm_failed_attempts").exists()
    if which == "term":  # the batch shell lived on and skipped NeMo-Run's requeue
        assert "\nnot requeued: the job's steps got SIGTERM" in sbatch_log(job)


def test_paths_gone_on_the_cluster_stop_the_job_at_its_first_step_in_one_line(slurm, jobs):
    """The data was there when the launcher checked it, gone when the job started: the job's
    first step names it in one line and the job ends (exit 2), before any rank starts and
    without a requeue."""
    job = jobs["data_gone"]
    assert job["state"] == "FAILED"
    log = sbatch_log(job)
    manifest = job["job_dir"] / "data" / "web.json"
    assert our_lines(log) == [
        f"error: data.blend={job['job_dir'] / 'web.yaml'}: manifest {manifest} is missing or "
        "not a prepare_data manifest; run scripts/prepare_data.py or name its <output>.json"]
    assert "Traceback" not in log and log_of(job, 0) == ""  # no torchrun started
    assert re.search(r"ExitCode=2:0", slurm.run("scontrol", "show", "job", job["job"]).stdout)
    assert restarts(slurm, job["job"]) == 0


def test_a_job_checks_its_paths_on_the_cluster_before_its_ranks_start(jobs):
    log = sbatch_log(jobs["killed"])
    assert re.search(r"^check=paths: every path tiny_dp2 names is in place on \S+$", log, re.M)


def test_a_refused_submit_is_one_line_with_slurms_words(jobs):
    result = jobs["refused"]
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: sbatch refused the job: invalid partition specified: nope; Batch job "
        "submission failed: Invalid partition name specified (Slurm's words; check "
        "partition=, account=, time= and the cluster file against sinfo)"]
    assert "Traceback" not in result.stdout + result.stderr

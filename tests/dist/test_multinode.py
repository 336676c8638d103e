"""Two "nodes" on this machine: two torchrun agents with `--nnodes 2` meet through a c10d
rendezvous over loopback (a port the OS picks) and train the tiny DP2 recipe, one rank each;
their losses equal one agent's two-rank run, step for step.

This is how a Slurm job starts (one torchrun per node, `scripts/launch.py`), minus Slurm. The
same two agents, run as scripts/agent/torchrun (trainer/launch/agent.py), show the faults of such a
run ending in one line each: a node that never joins, a rank SIGKILLed mid-run. The fault cases
mostly wait (a join timeout, a peer's grace period), so the module's fixture runs them side by
side, each on its own port and in its own folder.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.hang import HANG_S
from tests.side_by_side import selected_tests

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "scripts" / "pretrain.py")
TRAIN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
         "train.train_iters=4", "train.eval_interval=2", "train.eval_iters=1",
         "scheduler.warmup_iters=1", "checkpoint.save=false", "logging.progress_bar=false",
         "plugins.logging.loss_curve=false"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def losses(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {kind: [(r["step"], r["loss"]) for r in records if r["kind"] == kind]
            for kind in ("train", "heldout")}


def two_agents(run_dir: Path) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents, one rank each, rendezvousing on 127.0.0.1:<free port>."""
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=two-nodes"]
    args = torchrun(*rendezvous, SCRIPT, *TRAIN, f"run_dir={run_dir}", "cluster.nodes=2",
                    "cluster.gpus_per_node=1", "cluster.device=cpu")
    agents = [subprocess.Popen(args, cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for agent in agents:
        out, err = agent.communicate(timeout=HANG_S)
        results.append(subprocess.CompletedProcess(args, agent.returncode, out, err))
    return results


def test_two_torchrun_agents_train_as_one_agent_does(tmp_path):
    agents = two_agents(tmp_path / "two")
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    one = subprocess.run(
        torchrun("--standalone", "--nproc-per-node=2", SCRIPT, *TRAIN,
                 f"run_dir={tmp_path / 'one'}"),
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=HANG_S)
    assert one.returncode == 0, one.stderr[-3000:]
    two_nodes, one_node = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert [step for step, _ in two_nodes["train"]] == [1, 2, 3, 4]
    assert [step for step, _ in two_nodes["heldout"]] == [0, 2, 4]
    assert two_nodes == one_node  # bit-identical: the same ranks, met another way


# -- clear failures: a node that never joins, a rank that dies ---------------------------------

AGENT_DIR = REPO / "scripts" / "agent"  # its `torchrun`: trainer/launch/agent.py (NeMo-Run PATH)
JOIN_TIMEOUT_S = 5
DEATH_LINE = r"error: rank 1 \(node (\d), local rank 0\) died: signal SIGKILL"


def agent_environment(**extra: str) -> dict[str, str]:
    """As a NeMo-Run sbatch script has it: scripts/agent, then this environment's bin, on PATH."""
    path = os.pathsep.join([str(AGENT_DIR), str(Path(sys.executable).parent),
                            os.environ.get("PATH", "")])
    return {**environment(), "PATH": path, **extra}


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


def lonely_agent(tmp_path: Path) -> tuple[int, subprocess.CompletedProcess]:
    """One agent of two (scripts/agent/torchrun) whose other node never starts: its port and
    its end."""
    port = free_port()
    args = ["torchrun", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lonely",
            f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S}", SCRIPT, *TRAIN,
            f"run_dir={tmp_path}", "cluster.nodes=2", "cluster.gpus_per_node=1"]
    return port, subprocess.run(args, cwd=REPO, env=agent_environment(), capture_output=True,
                                text=True, timeout=HANG_S)


def agents_with_a_dying_rank(tmp_path: Path, **extra: str) -> list[tuple[int, str]]:
    """Two agents (scripts/agent/torchrun), one rank each; rank 1 is SIGKILLed before step 2.
    Returns each agent's (exit code, stderr + stdout); both must end by themselves (the wait
    is only a safety net for a hang, tests/hang.py)."""
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=dying"]
    args = ["torchrun", *rendezvous, str(REPO / "tests" / "dist" / "die_at_step.py"), *TRAIN,
            f"run_dir={tmp_path / 'run'}", "cluster.nodes=2", "cluster.gpus_per_node=1",
            "cluster.device=cpu"]
    stamp = tmp_path / "killed_at"  # the `faults` fixture waits for it too
    env = agent_environment(DIE_RANK="1", DIE_AT_STEP="2", DIE_STAMP=str(stamp), **extra)
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    agents = []
    for log in logs:
        with log.open("w") as out:
            agents.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=out,
                                           stderr=subprocess.STDOUT))
    deadline = time.monotonic() + HANG_S
    while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = [index for index, agent in enumerate(agents) if agent.poll() is None]
    for index in hung:
        agents[index].kill()
    results = [(agent.wait(), log.read_text()) for agent, log in zip(agents, logs, strict=True)]
    outputs = "\n".join(t for _, t in results)
    assert stamp.exists(), "rank 1 was never killed:\n" + outputs
    assert not hung, f"agents {hung} never ended:\n" + outputs[-3000:]
    return results


def dying_rank_case(survivor: str):
    """The two agents of `agents_with_a_dying_rank`, rank 0 failing or left hanging."""
    extra = {"HANG_RANK": "0"} if survivor == "hangs" else {}
    return lambda tmp_path: agents_with_a_dying_rank(tmp_path, **extra)


CASES = {  # test name: the fault case it checks, acted out in a fresh folder
    "test_a_node_that_never_joins_is_counted_in_one_line": lonely_agent,
    **{f"test_a_rank_that_dies_is_named_in_one_line[{survivor}]": dying_rank_case(survivor)
       for survivor in ("fails", "hangs")},
}


HANGS = "test_a_rank_that_dies_is_named_in_one_line[hangs]"


@pytest.fixture(scope="module")
def faults(request, tmp_path_factory) -> dict:
    """{test name: what its fault case ended with} for the selected fault tests, their agents
    run side by side (each case's `HANG_S` wait is its own). The hanging case starts first; the
    others once its rank 1 is killed, while its agents wait out the peer grace period idle, so
    that their start-up does not stretch its own."""
    wanted = [name for name in CASES if name in selected_tests(request)]
    folders = {name: tmp_path_factory.mktemp("fault") for name in wanted}
    with ThreadPoolExecutor(max(1, len(wanted))) as pool:
        started = {}
        if HANGS in wanted:
            started[HANGS] = pool.submit(CASES[HANGS], folders[HANGS])
            deadline = time.monotonic() + HANG_S
            while not ((folders[HANGS] / "killed_at").exists() or started[HANGS].done()
                       or time.monotonic() > deadline):
                time.sleep(0.2)
        started.update({name: pool.submit(CASES[name], folders[name])
                        for name in wanted if name != HANGS})
    return {name: future.result() for name, future in started.items()}


def test_a_node_that_never_joins_is_counted_in_one_line(faults):
    port, agent = faults["test_a_node_that_never_joins_is_counted_in_one_line"]
    assert agent.returncode == 1, agent.stderr[-3000:]
    assert "Traceback" not in agent.stderr + agent.stdout
    assert error_lines(agent.stderr) == [
        f"error: rendezvous at 127.0.0.1:{port} (id lonely) timed out after {JOIN_TIMEOUT_S} s: "
        "1 of 2 nodes joined; start the missing node's torchrun (check its Slurm log) or raise "
        "the wait with --rdzv-conf join_timeout=SECONDS"]


@pytest.mark.parametrize("survivor", ["fails", "hangs"])
def test_a_rank_that_dies_is_named_in_one_line(faults, survivor):
    """gloo: the survivor's collective fails at once and rank 0 names rank 1 from the run's
    store. "hangs": rank 0 sleeps, as an NCCL rank waits for the collective timeout; its agent
    reads the other agent's report and stops it (left sleeping, it would wake after 120 s and
    kill itself: another line than the one asserted)."""
    results = faults[f"test_a_rank_that_dies_is_named_in_one_line[{survivor}]"]
    outputs = "\n".join(text for _, text in results)
    assert all(code != 0 for code, _ in results), outputs[-3000:]
    assert "Traceback" not in outputs
    lines = error_lines(outputs)
    death = [line for line in lines if re.fullmatch(DEATH_LINE, line)]
    assert len(death) == 1, lines
    other_node = 1 - int(re.fullmatch(DEATH_LINE, death[0]).group(1))  # nodes join in any order
    stopped = f"error: node {other_node} stopped its ranks: {death[0][len('error: '):]}"
    named = ("error: rank 0 stopped: rank 1 left the run during a collective (it wrote no report: "
             "killed or crashed; see its own log)")
    others = [line for line in lines if line not in death]
    if survivor == "hangs":
        assert others == [stopped]
    else:  # rank 0 names rank 1; its agent adds its own line only if rank 0's exit lagged
        assert named in others and set(others) <= {named, stopped}, others

"""Two "nodes" on this machine: two torchrun agents with `--nnodes 2` meet through a c10d
rendezvous over loopback (a port the OS picks) and train the tiny DP2 recipe, one rank each;
their losses equal one agent's two-rank run, step for step.

This is how a Slurm job starts (one torchrun per node, `scripts/launch.py`), minus Slurm.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "scripts" / "pretrain.py")
TRAIN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
         "train.train_iters=4", "train.eval_interval=2", "train.eval_iters=1",
         "scheduler.warmup_iters=1", "checkpoint.save=false", "logging.progress_bar=false",
         "plugins.logging.loss_curve=false"]
TIMEOUT_S = 600


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
                    "cluster.gpus_per_node=1", "plugins.cpu_runtime.enabled=on")
    agents = [subprocess.Popen(args, cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for agent in agents:
        out, err = agent.communicate(timeout=TIMEOUT_S)
        results.append(subprocess.CompletedProcess(args, agent.returncode, out, err))
    return results


def test_two_torchrun_agents_train_as_one_agent_does(tmp_path):
    agents = two_agents(tmp_path / "two")
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    one = subprocess.run(
        torchrun("--standalone", "--nproc-per-node=2", SCRIPT, *TRAIN,
                 f"run_dir={tmp_path / 'one'}"),
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stderr[-3000:]
    two_nodes, one_node = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert [step for step, _ in two_nodes["train"]] == [1, 2, 3, 4]
    assert [step for step, _ in two_nodes["heldout"]] == [0, 2, 4]
    assert two_nodes == one_node  # bit-identical: the same ranks, met another way

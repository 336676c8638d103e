"""A real Slurm on this machine for the tests: munged, slurmctld and two slurmd, in one directory.

Debian's `slurm-wlm` and `munge` packages are all it needs (`.ci/run` installs them where they
are missing; the tests skip with the reason where they cannot be). Nothing is read from or
written to /etc, and systemd is not involved: every daemon runs in the foreground as a child of
the test session, with its key, socket, spool, pid and log files in the directory, found through
`SLURM_CONF`, and is stopped by its PID. The daemons talk over 127.0.0.1 on ports found free when
the cluster starts (22.05 has no setting to listen on loopback only, so they bind 0.0.0.0; every
address they are given is 127.0.0.1). Two `slurmd -N nodeK` on one host make two nodes.

The job credential lives `CRED_EXPIRE` seconds, the shortest Slurm accepts (`cred_expire` below
5 is refused and replaced by the default 120): a requeued job waits it out (plus
`sched_interval`) before it runs again, 155 s with Slurm's defaults and about 7 s here. A node
whose slurmd stops answering is set DOWN after three ping rounds, each of which waits up to
`MESSAGE_TIMEOUT` for the dead slurmd (Slurm retries a refused connection once a second for that
long): 25 s after the kill with Slurm's MessageTimeout=10, 15 s with 5 (measured, with
SlurmdTimeout=5). The partition `first` holds node1 alone, so that jobs kept off
node2 survive its loss; `held` holds node1 too but is DOWN, so a job submitted to it waits
(what the cluster holds can change meanwhile) until a test sets it UP.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.hang import HANG_S

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")
NODES = ("node1", "node2")
CRED_EXPIRE = 5  # seconds a job credential lives (Slurm's default is 120, its least 5)
SLURMD_TIMEOUT = 5  # seconds without an answer before a node is not responding (default 300)
# Seconds any Slurm message waits for its answer (default 10), and so each ping of a dead slurmd:
# half the default, while the daemons here answer in milliseconds (a submit: about 0.3 ms).
MESSAGE_TIMEOUT = 5
# Seconds from a step's SIGTERM to its SIGKILL: Slurm's default, which the torchrun agent's way
# out (its ranks stopped, then Slurm asked why) is made to fit; 5 s killed agents mid-line on a
# loaded machine. Processes that end at once do not wait for it.
KILL_WAIT = 30
FIRST_ONLY = "first"  # a partition of node1 alone
HELD = "held"  # node1 too, but DOWN: its jobs wait until a test sets it UP
START_TIMEOUT = HANG_S  # a daemon that dies is reported at once; this is for a hang


def missing_programs() -> list[str]:
    """The Slurm and munge programs not found on PATH (or in /usr/sbin)."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def why_not_here() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    missing = missing_programs()
    if missing:
        return (f"a real Slurm needs Debian's slurm-wlm and munge ({', '.join(missing)} not "
                "found); install them with apt-get install slurm-wlm munge (.ci/run does)")
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root); run the tests as root"
    return None


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now (held open together while choosing)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def slurm_conf(root: Path, host: str, ctld_port: int, node_ports: list[int]) -> str:
    """slurm.conf for one controller and two nodes on this host."""
    cpus = 4 * max(1, os.cpu_count() or 1)  # room for four jobs' torchruns on each node
    lines = [
        "ClusterName=mcoretest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ctld_port}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket,cred_expire={CRED_EXPIRE}",
        f"StateSaveLocation={root}/ctld", f"SlurmdSpoolDir={root}/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={root}/jobcomp.txt",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerParameters=sched_interval=2", "ReturnToService=2", "JobRequeue=1",
        "MpiDefault=none", "SlurmctldTimeout=30", f"SlurmdTimeout={SLURMD_TIMEOUT}",
        f"MessageTimeout={MESSAGE_TIMEOUT}",
        "InactiveLimit=0", f"KillWait={KILL_WAIT}", "MinJobAge=600",
        "SlurmdParameters=config_overrides",
    ]
    for name, port in zip(NODES, node_ports, strict=True):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={cpus} RealMemory=1000 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
                 "State=UP")
    lines.append(f"PartitionName={FIRST_ONLY} Nodes={NODES[0]} MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName={HELD} Nodes={NODES[0]} MaxTime=INFINITE State=DOWN")
    return "\n".join(lines) + "\n"


def process_states(pids: list[int]) -> str:
    """`PID STATE (WCHAN) COMMAND` of each process still alive: what a stuck job is doing."""
    rows = []
    for pid in pids:
        with contextlib.suppress(OSError):
            proc = Path("/proc") / str(pid)
            state = next(line.split(None, 1)[1].strip() for line in
                         (proc / "status").read_text().splitlines() if line.startswith("State:"))
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            rows.append(f"{pid} {state} ({(proc / 'wchan').read_text()}) {command}")
    return "; ".join(rows) or "none alive"


def job_processes(job: str, **environ: str) -> list[int]:
    """PIDs of this host's processes of Slurm job `job` (SLURM_JOB_ID in their environment)
    whose environment also holds every `environ` item."""
    wanted = {f"SLURM_JOB_ID={job}".encode(), *(f"{k}={v}".encode() for k, v in environ.items())}
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            variables = set((entry / "environ").read_bytes().split(b"\0"))
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and wanted <= variables:
            pids.append(int(entry.name))
    return pids


@dataclass
class LocalSlurm:
    """The daemons of one test Slurm; `env` is what a client (sbatch, launch.py) needs."""

    root: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    lost: list[tuple[str, str]] = field(default_factory=list)  # (node, job) `lose_node` hit

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf"),
                "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin"}

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - the daemon keeps it
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)

    def start(self) -> LocalSlurm:
        root, host = self.root, socket.gethostname().split(".")[0]
        for name in ("ctld", *NODES):
            (root / name).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ctld, *nodes = free_ports(1 + len(NODES))
        (root / "slurm.conf").write_text(slurm_conf(root, host, ctld, nodes))
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}",
                               f"--socket={root}/munge.socket", f"--pid-file={root}/munged.pid",
                               f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"])
        self._wait_for(lambda: (root / "munge.socket").exists(), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-c"])
        for name in NODES:
            self.start_slurmd(name)
        self._wait_for(lambda: all(s == "idle" for s in self.node_states().values()),
                       "both nodes idle")
        return self

    def start_slurmd(self, node: str) -> None:
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])

    def node_states(self) -> dict[str, str]:
        """sinfo's state of each node (`down*`: set down, not responding)."""
        result = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split() for line in result.stdout.splitlines() if line.strip())

    def lose_node(self, node: str, job: str) -> list[int]:
        """Node `node` lost, as one host can show it: its slurmd killed (SIGKILL) and the job's
        processes there stopped (SIGSTOP), as a node that died would leave them; their PIDs.
        Slurm kills them once the restarted slurmd registers again."""
        self.stop_daemon(f"slurmd-{node}")
        pids = job_processes(job, SLURMD_NODENAME=node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self.lost.append((node, job))
        return pids

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; "
                                   f"see {self.root}/*.out and *.log")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"no {what} after {START_TIMEOUT:.0f} s; see {self.root}/*.log")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check,
                              timeout=HANG_S)

    def stop_daemon(self, name: str) -> None:
        """Stop one daemon by its PID (a test kills a slurmd this way)."""
        process = self.processes.pop(name)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """Every daemon, by PID: the jobs are cancelled, then the nodes stopped, then the
        controller, then munged."""
        if "slurmctld" in self.processes:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                time.sleep(1)
        for node, job in self.lost:  # a lost node's processes that Slurm did not kill
            for pid in job_processes(job, SLURMD_NODENAME=node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for name in [n for n in self.processes if n.startswith("slurmd")] + ["slurmctld",
                                                                             "munged"]:
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=15)

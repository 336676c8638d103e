"""One-line reports of the faults a multi-node run meets: a node that never joins, a rank that dies.

torchrun's own reports are a bare `RendezvousTimeoutError` traceback (no count of the nodes that
did join) and a multi-line `ChildFailedError` box; a surviving rank sees only gloo's
"Connection closed by peer" (no rank) or, on NCCL, waits for the collective timeout. So:

- `main` is torchrun: torch's own `torch.distributed.run` (its parser, its `run`), plus the
  reporting. It keeps the rendezvous handler torchrun creates and, while the rendezvous is
  pending, remembers the most nodes seen joined, so a timeout says `1 of 2 nodes joined`. A
  rank of this node killed by a signal is named in one line with its node and local rank, and
  every failed rank is published in the round's rendezvous store: another node's agent whose
  ranks have not ended by themselves a few seconds later (NCCL ranks wait for the collective
  timeout) prints that line and stops them. `scripts/agent/torchrun` runs it under torchrun's
  name (NeMo-Run renders `torchrun ...`).
- `report_failure` runs on a rank whose step raised: it appends a one-line report to the
  run's store (the torchrun agent's store, which outlives a rank), and a rank whose collective
  failed waits a moment, reads who reported and names the ranks that did not (a SIGKILLed rank
  writes nothing) or quotes the reason of the one that failed by its own exception.

Faults exit 1 (2 is for user mistakes). Private torch internals used, each read defensively:
  torch/distributed/launcher/api.py:17,343 (launch_agent calls
    `rdzv_registry.get_rendezvous_handler` through the module, so wrapping that attribute sees
    the handler); torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1094 and :407
    (`handler._state_holder.state`) and :272-316 (`_RendezvousState.participants`, the nodes
    joined in this round; past the deadline, :914-917, a node removes itself before :680
    raises, hence the running maximum); torch/distributed/distributed_c10d.py:1433
    (`_get_default_store`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_FAULT = 1
REPORT_KEY = "mcore-recipes/fault-reports"  # appended lines: rank <TAB> kind <TAB> reason
SURVIVOR, FAILED = "survivor", "failed"
REPORT_GRACE_S = 2.0  # how long a survivor waits for the other ranks' reports
STORE_DEADLINE_S = 10.0  # longest a store call may take before the store counts as gone
POLL_S = 0.25  # how often the pending rendezvous is looked at
DEATH_KEY = "mcore-recipes/failed-ranks"  # in the round's rendezvous store: one line per node
PEER_GRACE_S = 10.0  # how long ranks may take to end by themselves after another node failed
LINGER_S = 15.0  # longest the first failing node's agent keeps its store up for the others
ENDED_KEY = "mcore-recipes/ended-agents"  # counts the agents done after a failure
DEFAULT_JOIN_TIMEOUT_S = 600.0  # torch's default join_timeout (dynamic_rendezvous.py:143-144)
DEFAULT_READ_TIMEOUT_S = 60.0  # the c10d store's default read_timeout
MAX_NAMED_RANKS = 8
# gloo's words for a peer that went away; NCCL's and the store's errors are torch DistErrors.
PEER_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                     "/gloo/transport/")


# -- the one-line messages (pure) -------------------------------------------------------------

def _seconds(value: float) -> str:
    return f"{value:g} s"


def rendezvous_timeout_line(endpoint: str, run_id: str, timeout_s: float, joined: int | None,
                            min_nodes: int, max_nodes: int) -> str:
    """The nodes that joined of those expected, and what to do about the missing ones."""
    count = "an unknown number" if joined is None else str(joined)
    expected = str(min_nodes) if min_nodes == max_nodes else f"at least {min_nodes}"
    noun = "node" if joined == 1 and min_nodes == 1 else "nodes"
    return (f"error: rendezvous at {endpoint} (id {run_id}) timed out after "
            f"{_seconds(timeout_s)}: {count} of {expected} {noun} joined; start the missing "
            "node's torchrun (check its Slurm log) or raise the wait with --rdzv-conf "
            "join_timeout=SECONDS")


def rendezvous_unreachable_line(endpoint: str, run_id: str, read_timeout_s: float) -> str:
    return (f"error: cannot reach the rendezvous store at {endpoint} (id {run_id}) within "
            f"{_seconds(read_timeout_s)}: the node that hosts it (the first node's torchrun) has "
            "not started or is unreachable; start it (check its Slurm log), check the address "
            "and port, or raise the wait with --rdzv-conf read_timeout=SECONDS")


def rendezvous_closed_line(endpoint: str, run_id: str) -> str:
    return (f"error: rendezvous at {endpoint} (id {run_id}) is closed: a run with this id "
            "already stopped; start again with a new --rdzv-id")


def signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return str(-exitcode)


def store_lost_line(endpoint: str, run_id: str, node: int) -> str:
    return (f"error: node {node} lost the rendezvous store at {endpoint} (id {run_id}) during "
            "the run: the first node's torchrun, which hosts it, stopped (its log names the "
            "first failure); stopped this node's ranks")


def signal_line(node: int | None, sigval: int, reason: str | None = None) -> str:
    """A signal to torchrun (Slurm ending the job): `reason` is Slurm's, when it could be asked."""
    where = "?" if node is None else node
    head = f"error: torchrun on node {where} got {signal_name(-int(sigval))} and stopped its ranks"
    if reason:
        return f"{head}: {reason}"
    return f"{head} (the job was cancelled, timed out or preempted?)"


@dataclass(frozen=True)
class RankExit:
    """A rank of this node that ended with an error."""

    rank: int
    node: int | None
    local_rank: int
    exitcode: int  # negative: killed by signal -exitcode

    def describe(self) -> str:
        node = "node ?" if self.node is None else f"node {self.node}"
        how = (f"died: signal {signal_name(self.exitcode)}" if self.exitcode < 0
               else f"exited with code {self.exitcode}")
        return f"rank {self.rank} ({node}, local rank {self.local_rank}) {how}"


def rank_death_line(exits: Sequence[RankExit]) -> str | None:
    """`error: rank 1 (node 1, local rank 0) died: signal SIGKILL`, for the ranks a signal
    stopped (the others printed their own reason), all on one line; None when there are none.
    Ranks ended by SIGTERM beside another rank's death or own error are torchrun stopping the
    node's other ranks after the first failure (torch/distributed/elastic/agent/server/api.py:954,
    `_stop_workers` once no restart is left): counted, not blamed."""
    deaths = sorted((e for e in exits if e.exitcode < 0), key=lambda e: e.rank)
    blamed = [e for e in deaths if e.exitcode != -signal.SIGTERM]
    if not blamed and not any(e.exitcode > 0 for e in exits):  # none printed its own reason
        blamed = deaths
    if not blamed:
        return None
    line = "error: " + "; ".join(e.describe() for e in blamed)
    stopped = len(deaths) - len(blamed)
    if stopped:
        line += f" (torchrun then stopped {stopped} other rank{'s' * (stopped > 1)} of its node)"
    return line


def rank_exit_summary(exits: Sequence[RankExit]) -> str:
    """This node's failed ranks on one line, as the other nodes' agents quote it."""
    return "; ".join(e.describe() for e in sorted(exits, key=lambda e: e.rank))


def one_line(error: BaseException, limit: int = 240) -> str:
    """`Type: first line of the message`, without tabs, cut to `limit` characters."""
    text = str(error).strip().splitlines()
    first = text[0].strip() if text else ""
    line = f"{type(error).__name__}: {first}" if first else type(error).__name__
    line = line.replace("\t", " ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def is_peer_loss(error: BaseException) -> bool:
    """A collective failed because another rank went away (not this rank's own fault)."""
    import torch.distributed as dist

    return isinstance(error, dist.DistError) or any(m in str(error) for m in PEER_LOSS_MARKERS)


def format_report(rank: int, kind: str, reason: str) -> str:
    return f"{rank}\t{kind}\t{reason}\n"


def parse_reports(text: str) -> dict[int, tuple[str, str]]:
    """rank -> (kind, reason) from the appended report lines; malformed lines are skipped."""
    reports: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        rank, _, rest = line.partition("\t")
        kind, _, reason = rest.partition("\t")
        if rank.isdigit() and kind in (SURVIVOR, FAILED):
            reports.setdefault(int(rank), (kind, reason))
    return reports


def _rank_list(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED_RANKS])
    more = len(ranks) - MAX_NAMED_RANKS
    return shown + (f" and {more} more" if more > 0 else "")


def survivor_line(rank: int, world_size: int, reports: dict[int, tuple[str, str]] | None,
                  own_reason: str) -> str | None:
    """What the lowest surviving rank prints (None on the others): the ranks that failed with
    their reason, then the ranks that wrote no report."""
    head = f"error: rank {rank} stopped: "
    if reports is None:
        return (head + f"a collective failed ({own_reason}) and the run's store cannot be read "
                "to learn which rank left (its host, the first node's torchrun, may be gone "
                "too); see the other ranks' logs")
    if any(r < rank and kind == SURVIVOR for r, (kind, _) in reports.items()):
        return None
    reports = {**reports, rank: reports.get(rank, (SURVIVOR, own_reason))}  # ours may be lost
    failed = [f"rank {r} failed: {reason}" for r, (kind, reason) in sorted(reports.items())
              if kind == FAILED]
    silent = [r for r in range(world_size) if r not in reports]
    if len(silent) == 1:
        failed.append(f"rank {silent[0]} left the run during a collective (it wrote no report: "
                      "killed or crashed; see its own log)")
    elif silent:
        failed.append(f"ranks {_rank_list(silent)} left the run during a collective (they wrote "
                      "no report: killed, crashed or still waiting; see their own logs)")
    if not failed:
        failed.append(f"a collective failed on every rank that reported ({own_reason})")
    return head + "; ".join(failed)


# -- the rank side ----------------------------------------------------------------------------

def _within(call: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """(done, value) of `call` run on a daemon thread for at most `seconds` (a store whose host
    vanished may block a call for the whole store timeout)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except Exception:  # noqa: BLE001 - a dead store reads as "no answer"
            pass

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return "value" in outcome, outcome.get("value")


def _default_store() -> Any:
    """The default process group's store (the torchrun agent's), or None without one."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _get_default_store  # distributed_c10d.py:1433

    try:
        return _get_default_store()
    except Exception:  # noqa: BLE001 - no store: the line says the others cannot be asked
        return None


def report_failure(error: BaseException) -> int | None:
    """On a rank whose work raised: append this rank's report to the run's store. A rank's own
    failure returns None (the caller re-raises: its traceback is the bug's location); a failed
    collective waits for the others' reports, prints one line (lowest survivor) and returns 1."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_initialized():
        world = dist.get_world_size()
    peer, reason = is_peer_loss(error), one_line(error)
    store = _default_store()
    if store is not None:
        report = format_report(rank, SURVIVOR if peer else FAILED, reason)
        _within(lambda: store.append(REPORT_KEY, report), STORE_DEADLINE_S)
    if not peer:
        return None
    reports = None
    if store is not None:
        time.sleep(REPORT_GRACE_S)
        done, text = _within(lambda: store.get(REPORT_KEY), STORE_DEADLINE_S)
        reports = parse_reports(bytes(text).decode(errors="replace")) if done else None
    line = survivor_line(rank, world, reports, reason)
    if line:
        print(line, file=sys.stderr, flush=True)
    return EXIT_FAULT


# -- the agent side ---------------------------------------------------------------------------

def joined_nodes(state: Any) -> int | None:
    """Nodes in the rendezvous round of a `_RendezvousState` (None when it cannot be read)."""
    participants = getattr(state, "participants", None)
    try:
        return len(participants) if participants is not None else None
    except TypeError:
        return None


class RendezvousWatch:
    """Keeps the rendezvous handler torchrun creates and the most nodes seen joined while the
    rendezvous was pending; once it completes, this node's rank and the round's store, which
    it watches for another node's failure (`peer_failure_line`)."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.most_joined: int | None = None
        self.node: int | None = None  # this node's rank (RendezvousInfo.rank)
        self.nodes = 1  # nodes in the run (RendezvousInfo.world_size)
        self.store: Any = None  # the round's store, shared by every node's agent
        self.finished = threading.Event()  # torchrun's run returned or raised
        self.stopped_ranks = False  # the peer watch stopped this node's ranks
        self._joined = threading.Event()

    def install(self) -> None:
        """Wrap the registry function launch_agent calls (launcher/api.py:17,343)."""
        from torch.distributed.elastic.rendezvous import registry

        create = registry.get_rendezvous_handler

        def create_and_keep(params):
            handler = create(params)
            self._keep(handler)
            return handler

        registry.get_rendezvous_handler = create_and_keep

    def _keep(self, handler: Any) -> None:
        self.handler = handler
        join = handler.next_rendezvous

        def join_and_note(*args, **kwargs):
            info = join(*args, **kwargs)  # public RendezvousInfo: rank, world_size, store
            self.node, self.nodes = info.rank, info.world_size
            self.store = info.store
            if not self._joined.is_set() and self.nodes > 1:
                threading.Thread(target=self._watch_peers, daemon=True).start()
            self._joined.set()
            return info

        handler.next_rendezvous = join_and_note
        threading.Thread(target=self._poll, daemon=True, name="rendezvous-watch").start()

    def _poll(self) -> None:
        while not self._joined.wait(POLL_S):
            holder = getattr(self.handler, "_state_holder", None)  # dynamic_rendezvous.py:1094
            joined = joined_nodes(getattr(holder, "state", None))
            if joined is not None:
                self.most_joined = max(joined, self.most_joined or 0)

    def _watch_peers(self) -> None:
        """Another node's agent published a failure: give this node's ranks PEER_GRACE_S to
        end by themselves (gloo fails at once), then stop them (NCCL would wait the timeout)."""
        while not self.finished.wait(1.0):
            done, found = _within(lambda: self.store.check([DEATH_KEY]), STORE_DEADLINE_S)
            if not (done and found):
                continue
            if self.finished.wait(PEER_GRACE_S):
                return
            _, text = _within(lambda: self.store.get(DEATH_KEY), STORE_DEADLINE_S)
            print(peer_failure_line(self.node, _text(text)), file=sys.stderr, flush=True)
            self.stopped_ranks = True
            os.kill(os.getpid(), signal.SIGTERM)  # torchrun's own handler stops the ranks
            return

    def publish(self, line: str) -> bool:
        """Append this node's failure for the other agents; True when this is the run's first."""
        store = self.store
        if store is None or not line:
            return False
        done, seen = _within(lambda: store.check([DEATH_KEY]), STORE_DEADLINE_S)
        _within(lambda: store.append(DEATH_KEY, line + "\n"), STORE_DEADLINE_S)
        return done and not seen

    def count_ended(self) -> None:
        """This agent is done with the run (after a failure): counted for `linger`."""
        if self.store is not None:
            _within(lambda: self.store.add(ENDED_KEY, 1), STORE_DEADLINE_S)

    def linger(self) -> None:
        """The first failing node's agent may host the store the others read: keep it up until
        every node's agent has ended, or LINGER_S (a lost node never counts itself)."""
        deadline = time.monotonic() + LINGER_S
        while self.store is not None and time.monotonic() < deadline:
            done, ended = _within(lambda: self.store.add(ENDED_KEY, 0), STORE_DEADLINE_S)
            if not done or ended >= self.nodes:
                return
            time.sleep(POLL_S)

    def timeout_s(self, rdzv_conf: str) -> float:
        settings = getattr(self.handler, "settings", None)  # public: RendezvousSettings
        try:
            return settings.timeout.join.total_seconds()
        except AttributeError:
            return _conf_seconds(rdzv_conf, "join_timeout", DEFAULT_JOIN_TIMEOUT_S)


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return "" if value is None else str(value)


def peer_failure_line(node: int | None, published: str) -> str:
    """What a node whose ranks were still running prints when another node's ranks failed."""
    lines = [line.strip() for line in published.splitlines() if line.strip()]
    cause = "; ".join(lines) if lines else "another node reported a failure"
    where = "?" if node is None else node
    return f"error: node {where} stopped its ranks: {cause}"


def _conf_seconds(rdzv_conf: str, key: str, default: float) -> float:
    """A number from torchrun's `--rdzv-conf a=1,b=2` (torch's default when absent)."""
    for item in (rdzv_conf or "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == key:
            try:
                return float(value)
            except ValueError:
                return default
    return default


def rank_exits(failure: Any, node: int | None) -> list[RankExit]:
    """The failed ranks of a torchrun `ChildFailedError`, by global rank."""
    return [RankExit(rank, node, f.local_rank, f.exitcode) for rank, f in failure.failures.items()
            if f.exitcode is not None]


def rendezvous_error_line(error: Exception, args: Any, watch: RendezvousWatch) -> str:
    """One line for each way torchrun's rendezvous fails (api.py's RendezvousError family)."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    endpoint, run_id = args.rdzv_endpoint, args.rdzv_id
    if isinstance(error, RendezvousTimeoutError):
        settings = getattr(watch.handler, "settings", None)
        min_nodes = getattr(settings, "min_nodes", None) or args.min_nodes
        max_nodes = getattr(settings, "max_nodes", None) or args.max_nodes
        return rendezvous_timeout_line(endpoint, run_id, watch.timeout_s(args.rdzv_conf),
                                       watch.most_joined, min_nodes, max_nodes)
    if isinstance(error, RendezvousConnectionError) and watch.node is not None:
        return store_lost_line(endpoint, run_id, watch.node)
    if isinstance(error, RendezvousConnectionError):
        read_s = _conf_seconds(args.rdzv_conf, "read_timeout", DEFAULT_READ_TIMEOUT_S)
        return rendezvous_unreachable_line(endpoint, run_id, read_s)
    if isinstance(error, RendezvousClosedError):
        return rendezvous_closed_line(endpoint, run_id)
    return f"error: rendezvous at {endpoint} (id {run_id}) failed: {one_line(error)}"


def store_host_conf(rdzv_conf: str, backend: str, environ: dict[str, str]) -> str:
    """`--rdzv-conf` with `is_host` set on a Slurm node: the first node of the allocation (the
    rendezvous endpoint's, SLURM_NODEID 0) hosts the store, the others connect to it. Without it
    torch decides by matching the endpoint's address against the machine's
    (c10d_rendezvous_backend.py:137-145), and where several nodes' agents share one address
    (nodes that are one host, an address every host answers to) whichever starts first hosts it:
    the run then dies with that node, and the others block in a store call that ignores SIGTERM
    until it times out. A user's own `is_host` stays; outside Slurm nothing changes."""
    node = environ.get("SLURM_NODEID", "")
    if backend != "c10d" or not node.isdigit() or "is_host" in _conf_keys(rdzv_conf):
        return rdzv_conf
    setting = f"is_host={'true' if int(node) == 0 else 'false'}"
    return f"{rdzv_conf},{setting}" if rdzv_conf else setting


def _conf_keys(rdzv_conf: str) -> set[str]:
    return {item.partition("=")[0].strip() for item in (rdzv_conf or "").split(",")}


def _nodes(args: Any) -> tuple[int, int]:
    from torch.distributed.run import parse_min_max_nnodes

    return parse_min_max_nnodes(args.nnodes)


def _import_torch_quietly() -> None:
    """Import torch with its C++ log at FATAL in this agent only: a store it cannot reach would
    print C++ stack frames above our one line. The level is read once, when libtorch loads, so
    it is removed again before any rank inherits the environment (a user's own level stays)."""
    if "torch" in sys.modules or "TORCH_CPP_LOG_LEVEL" in os.environ:
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch  # noqa: F401
    finally:
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)


def quiet_elastic_logs() -> None:
    """Our lines replace torch's reports of the same faults. Each torch.distributed.elastic
    module sets its own logger's level (elastic/utils/logging.py, `_setup_logger`), so the
    parent's level alone would not hide them: set every one imported so far."""
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def ranks_failed(failure: Any, watch: RendezvousWatch) -> int:
    """This node's ranks failed: name the ones a signal stopped (they printed nothing), tell
    the other nodes, and pass the ranks' own exit code on (2: a user mistake found on a rank)."""
    exits = rank_exits(failure, watch.node)
    line = rank_death_line(exits)
    if line and not watch.stopped_ranks:
        print(line, file=sys.stderr, flush=True)
    first = watch.publish(rank_exit_summary(exits))
    watch.count_ended()
    if first:
        watch.linger()
    codes = [e.exitcode for e in exits if e.exitcode > 0]
    return max(codes, default=EXIT_FAULT)


FAILED_ATTEMPTS_ENV = "MCORE_RECIPES_FAILED_ATTEMPTS"  # set by scripts/launch.py's sbatch
SIGNALLED_EXIT = 128 + signal.SIGTERM  # this agent's exit code when SIGTERM stopped its ranks
SLURM_ASK_S = 3.0  # longest one Slurm query may take (Slurm's KillWait, 30 s, ends the agent)


def slurm_job(environ: dict[str, str] | None = None) -> tuple[Any, int]:
    """(what Slurm says of this job now, or None; this attempt's SLURM_RESTART_COUNT)."""
    from trainer.launch.slurm_jobs import job_view, slurm_command

    env = os.environ if environ is None else environ
    attempt = int(env.get("SLURM_RESTART_COUNT") or 0)
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None, attempt
    ask = lambda argv: slurm_command(argv, timeout=SLURM_ASK_S)  # noqa: E731
    return job_view(job, env.get("SLURM_JOB_NODELIST", ""), run=ask), attempt


def note_failed_attempt(environ: dict[str, str] | None = None) -> None:
    """Record that this Slurm attempt failed (a rank died, a rendezvous failed), so that the
    job's `retries` count failures only: a requeue or a preemption stops the agent by SIGTERM
    and is not recorded, nor is a rank failure once Slurm is ending the attempt itself (the
    ranks of a lost node's peers fail because of it). One line per attempt
    (`SLURM_RESTART_COUNT`), whichever node writes."""
    from trainer.launch.slurm_jobs import ended_by_slurm

    env = os.environ if environ is None else environ
    path = env.get(FAILED_ATTEMPTS_ENV)
    if not path or ended_by_slurm(*slurm_job(env)):
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(f"{env.get('SLURM_RESTART_COUNT', '0')}\n")
    except OSError:
        pass  # a retry more or less is no reason to hide the fault's own line


def run_agent(argv: Sequence[str]) -> int:
    """torchrun with `argv`; every fault ends in one line on stderr and exit code 1."""
    _import_torch_quietly()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(list(argv))  # torchrun's own usage errors: exit 2
    args.min_nodes, args.max_nodes = _nodes(args)
    args.rdzv_conf = store_host_conf(args.rdzv_conf, args.rdzv_backend, dict(os.environ))
    quiet_elastic_logs()
    watch = RendezvousWatch()
    watch.install()
    try:
        run(args)
    except ChildFailedError as failure:
        watch.finished.set()
        note_failed_attempt()
        return ranks_failed(failure, watch)
    except RendezvousError as error:
        watch.finished.set()
        note_failed_attempt()
        print(rendezvous_error_line(error, args, watch), file=sys.stderr, flush=True)
        return EXIT_FAULT
    except SignalException as error:
        watch.finished.set()
        watch.count_ended()
        if watch.stopped_ranks:  # the peer watch stopped them and said why
            return EXIT_FAULT
        from trainer.launch.slurm_jobs import stop_reason

        reason = stop_reason(*slurm_job()) if error.sigval == signal.SIGTERM else None
        print(signal_line(watch.node, error.sigval, reason), file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    watch.finished.set()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_agent(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

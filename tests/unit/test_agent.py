"""trainer/launch/agent.py without a process group: the one-line messages, the count read from a
hand-made rendezvous state, the rank reports' format, who a survivor names, and the agents'
reports through a local store (a TCPStore on a port the OS picks)."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from tests.hang import HANG_S
from trainer.launch import agent
from trainer.launch.agent import (
    FAILED,
    SURVIVOR,
    RankExit,
    format_report,
    is_peer_loss,
    joined_nodes,
    one_line,
    parse_reports,
    peer_failure_line,
    rank_death_line,
    rank_exit_summary,
    rendezvous_timeout_line,
    report_failure,
    survivor_line,
)

REPO = Path(__file__).resolve().parents[2]
GLOO_PEER_GONE = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                  "closed by peer [127.0.0.1]:32474. This is typically caused by a remote worker "
                  "crashing.")


def test_timeout_line_counts_the_nodes_that_joined():
    assert rendezvous_timeout_line("127.0.0.1:40123", "two-nodes", 20.0, 1, 2, 2) == (
        "error: rendezvous at 127.0.0.1:40123 (id two-nodes) timed out after 20 s: 1 of 2 nodes "
        "joined; start the missing node's torchrun (check its Slurm log) or raise the wait with "
        "--rdzv-conf join_timeout=SECONDS")


def test_timeout_line_without_a_count_or_with_an_elastic_range():
    unknown = rendezvous_timeout_line("h:1", "r", 600.0, None, 4, 4)
    assert "an unknown number of 4 nodes joined" in unknown
    assert "3 of at least 4 nodes joined" in rendezvous_timeout_line("h:1", "r", 2.5, 3, 4, 8)
    assert "timed out after 2.5 s" in rendezvous_timeout_line("h:1", "r", 2.5, 3, 4, 8)


def test_joined_nodes_reads_a_hand_made_rendezvous_state():
    state = _RendezvousState()
    assert joined_nodes(state) == 0
    state.participants[_NodeDesc("node-a", 11, 0)] = 0
    state.participants[_NodeDesc("node-b", 12, 0)] = 1
    state.wait_list.add(_NodeDesc("node-c", 13, 0))  # waits for the next round: not joined
    assert joined_nodes(state) == 2
    assert joined_nodes(None) is None
    assert joined_nodes(SimpleNamespace(participants=object())) is None


def test_the_watch_keeps_the_most_nodes_seen_while_pending(monkeypatch):
    """The handler drops this node from the participants before it raises the timeout."""
    monkeypatch.setattr(agent, "POLL_S", 0.01)
    state = _RendezvousState()
    released = threading.Event()

    def next_rendezvous():
        released.wait(HANG_S)
        return SimpleNamespace(rank=1, world_size=1, store=None)

    handler = SimpleNamespace(_state_holder=SimpleNamespace(state=state),
                              next_rendezvous=next_rendezvous)
    watch = agent.RendezvousWatch()
    watch._keep(handler)
    state.participants[_NodeDesc("a", 1, 0)] = 0
    # The watch polls on its own thread: wait until it has seen the node (however loaded the
    # machine is), not a fixed time.
    deadline = time.monotonic() + HANG_S
    while watch.most_joined != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    state.participants.clear()  # the node leaves the round at its deadline
    time.sleep(0.1)
    released.set()
    assert handler.next_rendezvous().rank == 1
    assert watch.most_joined == 1 and watch.node == 1


def test_a_rank_killed_by_a_signal_is_named_with_its_node():
    exits = [RankExit(3, 1, 1, 1), RankExit(1, 0, 1, -9), RankExit(2, 1, 0, -11)]
    assert rank_death_line(exits) == (
        "error: rank 1 (node 0, local rank 1) died: signal SIGKILL; "
        "rank 2 (node 1, local rank 0) died: signal SIGSEGV")
    assert rank_death_line([RankExit(0, None, 0, 2)]) is None  # it printed its own reason
    stopped_by_torchrun = [RankExit(0, 0, 0, -15), RankExit(1, 0, 1, -9), RankExit(2, 0, 2, -15)]
    assert rank_death_line(stopped_by_torchrun) == (
        "error: rank 1 (node 0, local rank 1) died: signal SIGKILL (torchrun then stopped 2 "
        "other ranks of its node)")
    own_error_then_stopped = [RankExit(0, 0, 0, 3), RankExit(1, 0, 1, -15)]
    assert rank_death_line(own_error_then_stopped) is None  # rank 0 printed its own reason
    assert rank_death_line([RankExit(3, 1, 0, -15)]) == (  # SIGTERM alone is the cause
        "error: rank 3 (node 1, local rank 0) died: signal SIGTERM")
    assert rank_exit_summary([RankExit(4, None, 0, 2), RankExit(1, 0, 1, -15)]) == (
        "rank 1 (node 0, local rank 1) died: signal SIGTERM; "
        "rank 4 (node ?, local rank 0) exited with code 2")


def test_peer_failure_line_quotes_every_node_that_published():
    published = "rank 1 (node 1, local rank 0) died: signal SIGKILL\nrank 0 (node 0, ...)\n"
    assert peer_failure_line(2, published) == (
        "error: node 2 stopped its ranks: rank 1 (node 1, local rank 0) died: signal SIGKILL; "
        "rank 0 (node 0, ...)")
    assert peer_failure_line(None, "") == (
        "error: node ? stopped its ranks: another node reported a failure")


def test_reports_round_trip_and_skip_malformed_lines():
    text = (format_report(0, SURVIVOR, "RuntimeError: closed") + "garbage\n"
            + format_report(2, FAILED, "ValueError: bad batch") + "x\tsurvivor\t\n"
            + "3\tunknown\tr\n" + format_report(0, FAILED, "later duplicate"))
    assert parse_reports(text) == {0: (SURVIVOR, "RuntimeError: closed"),
                                   2: (FAILED, "ValueError: bad batch")}


def test_the_survivor_names_the_rank_that_wrote_nothing():
    reports = {0: (SURVIVOR, "RuntimeError: closed")}
    assert survivor_line(0, 2, reports, "RuntimeError: closed") == (
        "error: rank 0 stopped: rank 1 left the run during a collective (it wrote no report: "
        "killed or crashed; see its own log)")


def test_the_survivor_never_names_itself():
    """Its own report may not have reached the store: it is still no silent rank."""
    assert survivor_line(1, 2, {}, "r") == (
        "error: rank 1 stopped: rank 0 left the run during a collective (it wrote no report: "
        "killed or crashed; see its own log)")


def test_the_survivor_quotes_a_rank_that_failed_by_its_own_exception():
    reports = {0: (SURVIVOR, "r"), 1: (FAILED, "ValueError: bad batch"), 2: (SURVIVOR, "r")}
    assert survivor_line(0, 3, reports, "r") == (
        "error: rank 0 stopped: rank 1 failed: ValueError: bad batch")


def test_only_the_lowest_survivor_prints():
    reports = {0: (SURVIVOR, "r"), 1: (SURVIVOR, "r")}
    assert survivor_line(1, 3, reports, "r") is None
    assert survivor_line(0, 3, reports, "r").startswith("error: rank 0 stopped: rank 2 left")


def test_many_silent_ranks_are_listed_briefly():
    line = survivor_line(0, 20, {0: (SURVIVOR, "r")}, "r")
    assert "ranks 1, 2, 3, 4, 5, 6, 7, 8 and 11 more left the run during a collective" in line


def test_without_the_store_the_survivor_says_so():
    line = survivor_line(5, 8, None, "RuntimeError: Connection closed by peer")
    assert line.startswith("error: rank 5 stopped: a collective failed (RuntimeError: "
                           "Connection closed by peer) and the run's store cannot be read")
    assert survivor_line(0, 2, {0: (SURVIVOR, "r"), 1: (SURVIVOR, "r")}, "r") == (
        "error: rank 0 stopped: a collective failed on every rank that reported (r)")


def test_one_line_keeps_the_type_and_the_first_line():
    assert one_line(ValueError("bad\tbatch\nsecond line")) == "ValueError: bad batch"
    assert one_line(RuntimeError()) == "RuntimeError"
    long = one_line(RuntimeError("x" * 500), limit=40)
    assert len(long) == 40 and long.endswith("...")


def test_peer_loss_is_told_from_a_rank_s_own_error():
    assert is_peer_loss(RuntimeError(GLOO_PEER_GONE))
    assert is_peer_loss(dist.DistBackendError("NCCL watchdog: collective timed out"))
    assert not is_peer_loss(ValueError("shape mismatch"))


def test_report_failure_without_a_process_group(capsys, monkeypatch):
    """A rank's own error is left to its traceback; a lost peer still ends in one line."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert not dist.is_initialized()
    assert report_failure(ValueError("bad batch")) is None
    assert report_failure(RuntimeError(GLOO_PEER_GONE)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: rank 3 stopped: a collective failed (RuntimeError: [/pytorch/")
    assert len(err.splitlines()) == 1


def test_rdzv_conf_values_are_read_with_torch_s_default():
    assert agent._conf_seconds("join_timeout=5,read_timeout=7", "read_timeout", 60.0) == 7.0
    assert agent._conf_seconds("", "join_timeout", 600.0) == 600.0
    assert agent._conf_seconds("join_timeout=soon", "join_timeout", 600.0) == 600.0


def test_the_torchrun_shim_is_an_executable_named_torchrun():
    shim = REPO / "scripts" / "agent" / "torchrun"
    assert shim.read_text().startswith("#!/usr/bin/env python3\n")
    assert shim.stat().st_mode & stat.S_IXUSR and os.access(shim, os.X_OK)
    assert "from trainer.launch.agent import main" in shim.read_text()


@pytest.mark.parametrize("argv", [["--nnodes=2"], ["--no-such-option", "x.py"]])
def test_torchrun_usage_errors_stay_torchrun_s(argv):
    with pytest.raises(SystemExit) as caught:
        agent.run_agent(argv)
    assert caught.value.code == 2


@pytest.fixture
def round_store():
    """A rendezvous round's store as the agents share it: a local TCPStore, under a prefix."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.PrefixStore("torch.rendezvous.test.0", server)


def test_the_first_failing_agent_knows_it_is_first_and_waits_for_the_others(round_store,
                                                                             monkeypatch):
    monkeypatch.setattr(agent, "POLL_S", 0.01)
    first, second = agent.RendezvousWatch(), agent.RendezvousWatch()
    for watch in (first, second):
        watch.store, watch.nodes = round_store, 2
    assert first.publish("rank 1 (node 1, local rank 0) died: signal SIGKILL")
    first.count_ended()
    assert not second.publish("rank 0 (node 0, local rank 0) exited with code 1")
    second.count_ended()
    waits = []
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=time.monotonic,
                                                       sleep=waits.append))
    first.linger()  # both ended: returns at once
    assert waits == []  # it never waited for another poll
    assert round_store.get(agent.DEATH_KEY).decode().splitlines() == [
        "rank 1 (node 1, local rank 0) died: signal SIGKILL",
        "rank 0 (node 0, local rank 0) exited with code 1"]


def test_the_first_failing_agent_lingers_until_the_others_end_or_linger_s(round_store,
                                                                          monkeypatch):
    first, second = agent.RendezvousWatch(), agent.RendezvousWatch()
    for watch in (first, second):
        watch.store, watch.nodes = round_store, 2
    first.count_ended()
    waits = []

    def sleep(seconds):  # the other agent ends during the second wait
        waits.append(seconds)
        if len(waits) == 2:
            second.count_ended()

    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    first.linger()
    assert waits == [agent.POLL_S, agent.POLL_S]
    # A node that never counts itself (lost): given up at LINGER_S on the clock.
    clock = [0.0]
    lone = agent.RendezvousWatch()
    lone.store, lone.nodes = round_store, 3
    monkeypatch.setattr(agent, "time", SimpleNamespace(
        monotonic=lambda: clock[0], sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds)))
    lone.linger()
    assert agent.LINGER_S <= clock[0] < agent.LINGER_S + agent.POLL_S


def test_the_peer_watch_stops_ranks_that_outlive_another_node_s_failure(round_store, monkeypatch,
                                                                       capsys):
    monkeypatch.setattr(agent, "PEER_GRACE_S", 0.05)
    signals = []
    monkeypatch.setattr(agent.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    watch = agent.RendezvousWatch()
    watch.store, watch.node = round_store, 0
    round_store.append(agent.DEATH_KEY, "rank 1 (node 1, local rank 0) died: signal SIGKILL\n")
    watch._watch_peers()
    assert signals == [(os.getpid(), agent.signal.SIGTERM)] and watch.stopped_ranks
    assert capsys.readouterr().err == (
        "error: node 0 stopped its ranks: rank 1 (node 1, local rank 0) died: signal SIGKILL\n")


def test_a_sigterm_line_names_slurm_s_reason_when_slurm_can_be_asked():
    assert agent.signal_line(0, 15, "the job was cancelled (scancel)") == (
        "error: torchrun on node 0 got SIGTERM and stopped its ranks: the job was cancelled "
        "(scancel)")
    assert agent.signal_line(None, 15) == (
        "error: torchrun on node ? got SIGTERM and stopped its ranks (the job was cancelled, "
        "timed out or preempted?)")


def test_a_rank_failure_is_not_counted_once_slurm_is_ending_the_attempt(tmp_path, monkeypatch):
    from trainer.launch.slurm_jobs import JobView

    record = tmp_path / "slurm_failed_attempts"
    env = {agent.FAILED_ATTEMPTS_ENV: str(record), "SLURM_JOB_ID": "7",
           "SLURM_RESTART_COUNT": "1"}
    views = {"requeued": JobView("PENDING", 2, False), "running": JobView("RUNNING", 1, False)}
    monkeypatch.setattr(agent, "slurm_job", lambda environ=None: (views["requeued"], 1))
    agent.note_failed_attempt(env)  # a lost node's peers fail after Slurm requeued the job
    assert not record.exists()
    monkeypatch.setattr(agent, "slurm_job", lambda environ=None: (views["running"], 1))
    agent.note_failed_attempt(env)  # a rank died while the job runs: a failure
    assert record.read_text() == "1\n"


def test_slurm_job_reads_the_attempt_and_asks_nothing_outside_slurm(monkeypatch):
    from trainer.launch import slurm_jobs

    asked = []

    def scontrol(argv, timeout=None):
        asked.append(list(argv))
        return subprocess.CompletedProcess(argv, 1, "", "not here")

    monkeypatch.setattr(slurm_jobs, "slurm_command", scontrol)
    assert agent.slurm_job({"SLURM_RESTART_COUNT": "2"}) == (None, 2)
    assert agent.slurm_job({}) == (None, 0)
    assert asked == []  # no job id: Slurm is not asked
    assert agent.slurm_job({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}) == (None, 1)
    assert asked == [["scontrol", "show", "job", "-o", "7"]]


def test_the_first_slurm_node_hosts_the_store_and_the_others_connect():
    assert agent.store_host_conf("", "c10d", {"SLURM_NODEID": "0"}) == "is_host=true"
    assert (agent.store_host_conf("join_timeout=60", "c10d", {"SLURM_NODEID": "1"})
            == "join_timeout=60,is_host=false")


def test_the_store_host_is_left_to_torch_outside_slurm_or_when_the_user_chose():
    assert agent.store_host_conf("join_timeout=60", "c10d", {}) == "join_timeout=60"
    assert agent.store_host_conf("is_host=false", "c10d", {"SLURM_NODEID": "0"}) == "is_host=false"
    assert agent.store_host_conf("", "static", {"SLURM_NODEID": "0"}) == ""

"""Stopping a run as a user does, then continuing it: `scripts/pretrain.py` on two local ranks,
stopped mid-run by Ctrl-C (SIGINT to the terminal's process group, as the keyboard sends it)
or by SIGTERM to the launching process (`kill PID`), with `checkpoint.save_on_stop=true`.

Every rank stops after the same step and saves it; the launching process ends with 128 + the
signal and says so in one line, with no traceback and nothing else on stderr; the stop is
recorded in metrics.jsonl. Continued with `checkpoint.resume=true`, the run trains on from the
saved step, each step once in metrics.jsonl, and its loss curve is the whole run's (drawn from
metrics.jsonl: the picture equals that of every record), not only the steps since the resume.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
RUN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=120000",
       "train.train_iters=2000", "scheduler.warmup_iters=1", "train.eval_iters=0",
       "train.eval_interval=0",
       "logging.progress_bar=false", "logging.log_interval=1", "checkpoint.save_on_stop=true"]
STOP_AFTER = 3  # steps logged before the signal


def pretrain(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / "pretrain.py"), *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # a line being written
    return [record["step"] for line in lines if (record := json.loads(line))["kind"] == "train"]


def stopped(run_dir: Path, how: signal.Signals) -> tuple[subprocess.CompletedProcess, int]:
    """The run started, stopped by `how` once it has logged STOP_AFTER steps; (its output,
    the step its ranks stopped after)."""
    run = pretrain(*RUN, f"run_dir={run_dir}", start_new_session=True)
    deadline = time.monotonic() + HANG_S
    while len(train_steps(run_dir)) < STOP_AFTER and run.poll() is None:
        assert time.monotonic() < deadline, "the run never logged its first steps"
        time.sleep(0.1)
    if how == signal.SIGINT:
        os.killpg(run.pid, signal.SIGINT)  # the terminal's Ctrl-C: its whole process group
    else:
        os.kill(run.pid, signal.SIGTERM)  # `kill PID` of the launching process
    out, err = run.communicate(timeout=HANG_S)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [stop] = [record for record in records if record["kind"] == "stopped"]
    return subprocess.CompletedProcess(run.args, run.returncode, out, err), stop["step"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """`runs(how)`: (output, stopped step, run directory) of the run stopped by `how`, each
    stopped once when first asked for."""
    done: dict = {}

    def stop(how: signal.Signals):
        if how not in done:
            run_dir = tmp_path_factory.mktemp(how.name) / "run"
            done[how] = (*stopped(run_dir, how), run_dir)
        return done[how]
    return stop


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_run_ends_every_rank_in_one_line_and_saves_its_step(how, runs):
    result, step, run_dir = runs(how)
    assert result.returncode == 128 + how
    words = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}[how]
    checkpoint = run_dir / "checkpoints" / f"step_{step:07d}"
    assert result.stderr.splitlines() == [
        f"stopped by {words} after step {step} of 2000; every rank ended; saved {checkpoint} at "
        f"the stop; continue with: python scripts/pretrain.py config={run_dir / 'config.yaml'} "
        f"run_dir={run_dir} checkpoint.resume=true"]
    assert "Traceback" not in result.stdout and "KeyboardInterrupt" not in result.stdout
    assert step >= STOP_AFTER and train_steps(run_dir) == list(range(1, step + 1))
    assert (run_dir / "checkpoints" / "latest").read_text() == checkpoint.name


def test_a_continued_run_trains_on_and_draws_the_whole_run(runs, tmp_path):
    from plugins.logging.curves import plot_curves, read_run

    _, step, run_dir = runs(signal.SIGINT)
    more = pretrain(f"config={run_dir / 'config.yaml'}", f"run_dir={run_dir}",
                    "checkpoint.resume=true", f"train.train_iters={step + 3}")
    out, err = more.communicate(timeout=HANG_S)
    assert more.returncode == 0, err[-3000:]
    assert re.search(rf"resume: resuming from \S+/step_{step:07d} ", out)
    assert train_steps(run_dir) == list(range(1, step + 4))  # each step once
    whole = read_run(run_dir)
    assert [s for s, _ in whole.train_loss] == list(range(1, step + 4))
    expected = plot_curves([whole], tmp_path / "expected.png", run_dir.name)
    assert (run_dir / "loss_curve.png").read_bytes() == expected.read_bytes()

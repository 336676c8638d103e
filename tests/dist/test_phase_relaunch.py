"""A run whose second phase needs a new launch (sequence 32 -> 64 and CP1 -> CP2 on 2 ranks,
so DP2 -> DP1): `scripts/pretrain.py`'s launching process trains phase 1, and from the
checkpoint it saved at the boundary launches phase 2 in its own layout by itself. The result
is the one two launches by hand give (the first, then the command it prints): the same losses,
learning rates, phases, batches and tokens per source at every step, the same counters in the
final checkpoint.

The launching process is the real one, in this test's process (resolve, paths, machine,
pre-flight, run directory, the phases' loop); its ranks are forked by the session's rank server
(torch imported once) instead of started by torch's launcher, and run the real rank path.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

START = "tests.dist.test_phase_relaunch:start"
STEPS, BOUNDARY = 6, 3
RUN = ["recipe=tiny_dp2", "data.source=synthetic", "data.max_corpus_bytes=60000",
       f"train.train_iters={STEPS}", "scheduler.warmup_iters=1", "train.eval_iters=0",
       "train.eval_interval=0", "logging.progress_bar=false", "plugins.logging.loss_curve=false",
       "model.seq_length=32",
       f"phases=[{{name: short, end_step: {BOUNDARY}, seq_length: 32}}, {{name: long, "
       f"end_step: {STEPS}, seq_length: 64, context: 2, relaunch: true}}]"]
SAME = ("step", "loss", "lr", "grad_norm", "loss_tokens", "phase", "phase_name", "global_batch",
        "source_tokens")
COUNTERS = ("step", "consumed_samples", "consumed_tokens", "layout")


def start(payload: dict) -> dict:
    """One rank of pretrain.py: the launcher's environment, then the real entry."""
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import parse_arguments

    os.environ.update(payload.get("environment", {}))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = PRETRAIN.run(parse_arguments(PRETRAIN, payload["argv"]))
    return {"code": code, "stdout": printed.getvalue()}


def fork_launches(launch_ranks, monkeypatch) -> list[list[str]]:
    """The launching process's rank launches, forked by the session's rank server (`start` on
    each rank) instead of torch's launcher; returns the list each launch's argv is added to."""
    from trainer.launch import local

    launches: list[list[str]] = []

    def fork_ranks(world, script, argv, environment) -> int:
        launches.append(argv)
        results = launch_ranks(world, START, {"argv": argv, "environment": environment})
        return max(result["code"] for result in results)

    monkeypatch.setattr(local, "launch_local_ranks", fork_ranks)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return launches


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(line) for line in lines if '"kind": "train"' in line]
    return [{key: record[key] for key in SAME} for record in train]


def _counters(run_dir: Path) -> dict:
    manifest = json.loads((run_dir / "checkpoints" / "step_0000006" / "run.json").read_text())
    return {key: manifest[key] for key in COUNTERS}


def test_pretrain_launches_the_next_phase_itself_as_two_hand_launches_do(
        launch_ranks, tmp_path, monkeypatch, capsys):
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import parse_arguments

    launches = fork_launches(launch_ranks, monkeypatch)
    auto = tmp_path / "auto"
    assert PRETRAIN.run(parse_arguments(PRETRAIN, [*RUN, f"run_dir={auto}"])) == 0
    out = capsys.readouterr().out
    assert len(launches) == 2  # the second from the run's saved config, in phase 2's layout
    saved = (auto / "config.yaml").read_text()
    assert "seq_length: 64" in saved and "context: 2" in saved
    assert (f"phase 'long' starts at step {BOUNDARY}: launching it from {auto / 'checkpoints'} "
            "with checkpoint.load=null checkpoint.load_model_only=false checkpoint.resume=true "
            "model.seq_length=64 parallel.context=2 data.documents=concatenate "
            "train.micro_batch_size=2") in out
    assert "layout DP2 (2 ranks) -> CP2 (2 ranks)" in out  # the resharded full resume

    # By hand: the first launch, then the command it prints, as an outside launch (no loop).
    hand = tmp_path / "hand"
    [first, _] = launch_ranks(2, START, {"argv": [*RUN, f"run_dir={hand}"]})
    command = re.search(r"continue with scripts/pretrain\.py (.+)", first["stdout"]).group(1)
    [second, _] = launch_ranks(2, START, {"argv": command.split()})
    assert first["code"] == second["code"] == 0

    records = _records(auto)
    assert records == _records(hand)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["phase_name"] for r in records] == ["short"] * BOUNDARY + ["long"] * BOUNDARY
    assert [r["source_tokens"]["synthetic"] for r in records] == [
        8 * 32 * step for step in (1, 2, 3)] + [8 * 32 * 3 + 8 * 64 * k for k in (1, 2, 3)]
    counters = _counters(auto)
    assert counters == _counters(hand)
    assert (counters["step"], counters["consumed_samples"]) == (STEPS, STEPS * 8)
    assert counters["layout"]["cp"] == 2 and counters["layout"]["dp"] == 1

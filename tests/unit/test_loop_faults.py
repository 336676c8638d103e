"""The training loop's edges, each on its own: fp16 loss scaling that cannot avoid overflow
(static or at its float32 floor) stops the run and the summary counts skipped steps; the scale
is read only after a skipped step; a stop after the last step began lets the run finish; a
held-out split too small for one batch or for `train.eval_iters` is said with its fix; the
non-finite line names fp16 only on fp16 runs."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from rich.console import Console

from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


def _cfg(*overrides: str):
    return apply_overrides(get_recipe("tiny_dp1"), list(overrides))


def _fp16_session(overrides: list[str], scales: list[float]):
    """A session whose optimizer's scale is each of `scales` in turn (float32, as Megatron
    keeps it); `reads` counts the reads."""
    from trainer.state import RunState

    session = types.SimpleNamespace(cfg=_cfg("precision.dtype=fp16", *overrides),
                                    state=RunState(step=0), reads=0)

    def get_loss_scale():
        session.reads += 1
        return torch.tensor([scales[min(session.reads, len(scales)) - 1]], dtype=torch.float32)

    session.optimizer = types.SimpleNamespace(get_loss_scale=get_loss_scale)
    return session


def _skips(session, steps: int) -> None:
    from trainer.loop import record_skipped_update

    floored = False
    for step in range(1, steps + 1):
        floored = record_skipped_update(session, types.SimpleNamespace(print=print), step,
                                        floored)


# ---- 1. a loss scale that cannot avoid overflow ---------------------------------------------

def test_dynamic_scaling_stuck_at_a_floor_that_is_no_power_of_two_stops_the_run():
    from trainer.loop import NonFiniteError

    session = _fp16_session(["precision.initial_loss_scale=1e30",
                             "precision.min_loss_scale=1e30"], [1e30])
    with pytest.raises(NonFiniteError, match=r"^gradients overflowed on steps 1 and 2 even at "
                       r"precision.min_loss_scale=1e\+30; lower optimizer.lr"):
        _skips(session, 6)
    assert session.state.skipped_steps == 2


def test_a_static_loss_scale_that_overflows_on_consecutive_steps_stops_the_run():
    from trainer.loop import NonFiniteError

    session = _fp16_session(["precision.loss_scale=1e30"], [1e30])
    with pytest.raises(NonFiniteError, match=r"^gradients overflowed on steps 1 and 2 at the "
                       r"static precision.loss_scale=1e\+30; lower precision.loss_scale, set "
                       r"precision.loss_scale=null \(dynamic scaling\) or use precision.dtype="
                       r"bf16 instead of fp16$"):
        _skips(session, 6)


def test_a_scale_that_can_still_go_lower_or_exit_on_nonfinite_off_goes_on_skipping():
    halving = _fp16_session(["precision.min_loss_scale=1"], [2.0**(20 - k) for k in range(6)])
    _skips(halving, 6)
    assert halving.state.skipped_steps == 6
    kept_on = _fp16_session(["precision.loss_scale=4", "train.exit_on_nonfinite=false"], [4.0])
    _skips(kept_on, 6)
    assert kept_on.state.skipped_steps == 6


def test_the_summary_counts_skipped_steps_only_when_there_were_some():
    from trainer.summary import print_summary

    base = {"recipe": "tiny_dp1", "layout": "x", "backend": "CPU", "parameters": 1, "steps": 6,
            "tokens_seen": 1, "effective_tokens_per_s": 1.0, "model_tflops_per_gpu": 1.0,
            "mfu": None, "first_train_loss": 1.0, "final_train_loss": 1.0,
            "heldout_loss_start": None, "heldout_loss_end": None, "run_dir": "r",
            "checkpoint": None, "source_tokens": {}, "phases": []}

    def printed(summary: dict) -> str:
        out = io.StringIO()
        print_summary(summary, Console(file=out, width=200))
        return out.getvalue()

    assert "updates skipped (fp16 overflow)" in printed({**base, "skipped_steps": 6})
    assert "skipped" not in printed({**base, "skipped_steps": 0})


# ---- 5. the scale is read after a skipped step only -----------------------------------------

def test_the_loop_reads_the_loss_scale_only_after_a_skipped_step(monkeypatch):
    import trainer.loop

    skipped_at = {3}
    session = _fp16_session(["checkpoint.save=false", "train.train_iters=6"], [1024.0])
    session.eval_steps = 0
    session.plugins = types.SimpleNamespace(after_update=lambda step: None)
    span = types.SimpleNamespace(index=0, start_step=0)
    session.train_batches = types.SimpleNamespace(spans=[span], phase_at=lambda step: span)

    def run_step(session):
        session.state.step += 1
        return types.SimpleNamespace(step=session.state.step, grad_norm=1.0,
                                     skipped=session.state.step in skipped_at)

    monkeypatch.setattr(trainer.loop, "run_step", run_step)
    monkeypatch.setattr(trainer.loop, "settle_steps", lambda session, pending: [])
    stop = types.SimpleNamespace(begin_step=lambda: None, end_step=lambda: None, agreed=0)
    reporter = types.SimpleNamespace(print=print, reached=lambda step: None)
    graphs = types.SimpleNamespace(before_step=lambda step: None)
    trainer.loop._steps(session, reporter, lambda step: None, stop, trainer.loop.RunHistory(),
                        6, graphs)
    assert session.reads == 1 and session.state.skipped_steps == 1


# ---- 2. a stop after the last step began ----------------------------------------------------

RANK = """
import os, signal, sys, types
import trainer.loop as loop
from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from trainer.state import RunState

cfg = apply_overrides(get_recipe("tiny_dp1"), ["train.train_iters=3"])
session = types.SimpleNamespace(cfg=cfg, state=RunState(step=2))

def last_step(session, reporter, collect, stop):  # Ctrl-C while the last step runs
    os.kill(os.getpid(), signal.SIGINT)
    session.state.step = int(sys.argv[1])
    return "history"

loop._train = last_step
loop.async_save.finish_saves = lambda session, blocking: None
print(loop.run_training(session, types.SimpleNamespace(print=print)), flush=True)
"""


@pytest.mark.parametrize(("reached", "finishes"), [(3, True), (2, False)])
def test_a_stop_after_the_last_step_began_lets_the_rank_finish(reached, finishes):
    rank = subprocess.run([sys.executable, "-c", RANK, str(reached)], cwd=REPO, text=True,
                          capture_output=True, timeout=HANG_S)
    if finishes:
        assert rank.returncode == 0, rank.stderr[-2000:]
        assert rank.stdout.splitlines()[-2:] == [
            "SIGINT came after the last step began: the run is complete (3 steps) and ends as "
            "usual", "history"]
    else:  # steps left: the signal ends the rank as before, its launcher says the line
        assert rank.returncode == -signal.SIGINT


def test_the_stop_line_of_a_run_that_finished_says_it_is_complete(tmp_path):
    from trainer.entry.pipeline import _records, finished_run, stopped_line

    cfg = _cfg("train.train_iters=3")
    records = [*({"kind": "train", "step": s} for s in (1, 2, 3)), {"kind": "summary"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert finished_run(_records(tmp_path), cfg)
    assert stopped_line(tmp_path, cfg, signal.SIGINT) == (
        "Ctrl-C (SIGINT) came after the last step began: the run is complete (step 3 of 3, its "
        f"summary in {tmp_path / 'metrics.jsonl'}); nothing to continue")
    assert not finished_run(records[:-1], cfg)  # killed before its summary: stopped
    assert not finished_run(records[:2] + records[-1:], cfg)  # a launch before a later phase


# ---- 4. a held-out split too small ----------------------------------------------------------

def test_a_heldout_split_below_one_batch_is_named_with_the_fraction_that_fixes_it():
    from trainer.data import heldout_batch_problem

    cfg = _cfg("data.heldout_fraction=0.0001")
    assert heldout_batch_problem(cfg, 3, 30_000) == (
        "the held-out split has 3 samples, fewer than one global batch (8); raise "
        "data.heldout_fraction to at least 0.00027, or lower train.global_batch_size")
    assert int(30_000 * 0.00027) >= 8 > int(30_000 * 0.00026)
    assert heldout_batch_problem(cfg, 8, 30_000) is None


def test_an_evaluation_cut_short_of_eval_iters_is_noted_with_its_fix():
    from trainer.data import eval_batches_note

    cfg = _cfg("train.eval_iters=4")
    assert eval_batches_note(cfg, 20, 1000) == (
        "note: held-out evaluation uses 2 of train.eval_iters=4 global batches: the held-out "
        "split has 20 samples, 8 a batch; raise data.heldout_fraction to at least 0.032 for "
        "all 4")
    assert eval_batches_note(cfg, 32, 1000) is None


# ---- 6. the non-finite line ------------------------------------------------------------------

@pytest.mark.parametrize(("dtype", "fp16_hint"), [("fp32", False), ("bf16", False),
                                                  ("fp16", True)])
def test_the_nonfinite_line_suggests_leaving_fp16_only_on_fp16_runs(monkeypatch, dtype,
                                                                    fp16_hint):
    import trainer.loop
    from plugins.protocol.events import StepMetrics

    monkeypatch.setattr(trainer.loop, "_ranks_with_nonfinite_grads", lambda model: [])
    session = types.SimpleNamespace(cfg=_cfg(f"precision.dtype={dtype}"), model=[])
    metrics = StepMetrics(step=4, loss=float("nan"), lr=1e-3, grad_norm=1.0, loss_tokens=1,
                          step_time_s=0.1)
    with pytest.raises(trainer.loop.NonFiniteError) as error:
        trainer.loop.check_finite(session, metrics)
    assert ("fp16" in str(error.value)) == fp16_hint
    assert str(error.value).endswith("lower optimizer.lr or raise scheduler.warmup_iters"
                                     if not fp16_hint else "instead of fp16")

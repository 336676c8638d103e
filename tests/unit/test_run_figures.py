"""The run's figures have one definition each and say what they cover: MFU divides by the
planner's peak (the GEMMs' precision) and names it, or says why it is unknown; a step's tokens/s
is throughput's definition over one step; the summary says which steps it covers and keeps its
two token counts apart; a stop is recorded at the step it saved."""

from __future__ import annotations

import io
import json
import signal
import types

import pytest
import torch
from rich.console import Console

from plugins.protocol.events import StepMetrics
from recipes.config.overrides import apply_overrides
from recipes.config.phases import phase_spans
from recipes.plan.cluster import gemm_peak_tflops, load_cluster
from recipes.registry import get_recipe
from trainer.state import RunHistory, RunState

H100 = "conf/cluster/h100_80gb_8x8.yaml"
FP8 = ["precision.dtype=bf16", "plugins.fp8.format=hybrid", "plugins.fp8.recipe=tensorwise"]
NVFP4 = ["precision.dtype=bf16", "plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4"]


def _cfg(*overrides: str):
    return apply_overrides(get_recipe("tiny_dp1"), list(overrides))


def _history(steps: int = 4, seconds: float = 2.0, loss_tokens: int = 1000,
             flops: float = 4e15) -> RunHistory:
    history = RunHistory()
    for _ in range(steps):
        history.record_step(2.0, seconds, loss_tokens, flops)
    return history


def _printed(summary: dict) -> str:
    from trainer.summary import print_summary

    out = io.StringIO()
    print_summary(summary, Console(file=out, width=300))
    return out.getvalue()


# ---- 1. one peak for MFU ---------------------------------------------------------------------

def test_an_fp8_runs_mfu_divides_by_the_fp8_peak_the_planner_times_it_by():
    from trainer.summary import speed_summary

    cfg = _cfg(*FP8, f"cluster.spec={H100}")
    planner = gemm_peak_tflops(cfg, load_cluster(H100))
    assert planner == load_cluster(H100).peak_tflops["fp8"] != load_cluster(
        H100).peak_tflops["bf16"]
    speed = speed_summary(cfg, _history())
    assert (speed["peak_tflops"], speed["peak_precision"]) == (planner, "fp8")
    assert speed["mfu"] == pytest.approx(speed["model_tflops_per_gpu"] / planner)
    assert speed["mfu_unknown"] is None
    line = _printed({**_summary_base(), **speed})
    assert f"of the fp8 peak, {planner:g} TFLOP/s per GPU" in line
    bf16 = speed_summary(_cfg("precision.dtype=bf16", f"cluster.spec={H100}"), _history())
    assert (bf16["peak_tflops"], bf16["peak_precision"]) == (989.0, "bf16")


def _step_metrics(cfg) -> StepMetrics:
    """One step through `settle_steps`'s own arithmetic (`_metrics`, given the peak
    `settle_steps` reads once: `run_peak`), 1 rank."""
    from trainer.step_clock import run_peak
    from trainer.step_figures import StepRecord, _metrics

    record = StepRecord(step=1, phase=phase_spans(cfg)[0], global_batch=8, lr=1e-3,
                        grad_norm=1.0, skipped=False, clock=None, losses=None,
                        sequences=(1024, 1024 * 128), measured=True)
    values = [2000.0, 1000.0, 0.1, 1.8, 0.1, 1024.0, 1024.0 * 128]
    return _metrics(cfg, record, 2.0, [], values, 1000, 0, 1, run_peak(cfg).tflops)


def test_each_steps_mfu_divides_by_the_gemm_precisions_peak():
    metrics = _step_metrics(_cfg(*FP8, f"cluster.spec={H100}"))
    assert metrics.mfu == pytest.approx(metrics.model_tflops_per_gpu / 1979.0)


def test_a_cluster_file_without_the_gemms_peak_leaves_mfu_unknown_and_says_why():
    """An NVFP4 run on a file of GPUs without an FP4 peak (the planner refuses that file; a
    run only reports): the steps and the summary finish with MFU None, never the BF16 peak."""
    from trainer.summary import speed_summary

    cfg = _cfg(*NVFP4, f"cluster.spec={H100}")
    assert _step_metrics(cfg).mfu is None
    speed = speed_summary(cfg, _history())
    assert speed["mfu"] is None and speed["peak_tflops"] is None
    assert speed["mfu_unknown"] == (f"{H100} gives no peak_tflops.fp4 for this run's fp4 "
                                    "GEMMs")
    assert f"- ({H100} gives no peak_tflops.fp4 for this run's fp4 GEMMs)" in _printed(
        {**_summary_base(), **speed})
    unnamed = speed_summary(_cfg(*FP8), _history())
    assert unnamed["mfu"] is None and "cluster.spec=" in unnamed["mfu_unknown"]


def test_the_step_record_and_log_line_name_the_peak_mfu_divides_by(tmp_path, monkeypatch,
                                                                    capsys):
    from trainer.metrics import RunReporter
    from trainer.step_clock import run_peak

    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    reporter = RunReporter(tmp_path, total_steps=1, log_interval=1, progress_bar=False,
                           peak=run_peak(_cfg(*FP8, f"cluster.spec={H100}")))
    metrics = _step_metrics(_cfg(*FP8, f"cluster.spec={H100}"))
    reporter.step(metrics, 1)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert (record["peak_tflops"], record["peak_precision"]) == (1979.0, "fp8")
    assert f"| MFU {metrics.mfu:.1%} of fp8 peak |" in capsys.readouterr().out


# ---- 2. a step's tokens/s is throughput's definition over one step ---------------------------

@pytest.mark.parametrize(("seconds", "tokens"), [(2.0, 1000), (0.0, 1000), (0.37, 4096)])
def test_a_steps_tokens_per_s_is_the_effective_rate_over_a_one_step_window(seconds, tokens):
    """A guard: the protocol's `StepMetrics.tokens_per_s` (which cannot import the trainer),
    which the log line and the train record show, is `tokens_per_second` over the one step."""
    from trainer.throughput import tokens_per_second

    metrics = StepMetrics(step=1, loss=2.0, lr=1e-3, grad_norm=1.0, loss_tokens=tokens,
                          step_time_s=seconds)
    one = tokens_per_second([(seconds, tokens)])
    assert metrics.tokens_per_s == one


# ---- 3, 4. which steps the summary covers; its two token counts ------------------------------

def _summary_base() -> dict:
    return {"recipe": "tiny_dp1", "layout": "x", "backend": "CPU", "parameters": 1,
            "steps": 4, "tokens_seen": 1, "effective_tokens_per_s": 1.0,
            "model_tflops_per_gpu": 1.0, "mfu": None, "first_train_loss": 1.0,
            "final_train_loss": 1.0, "heldout_loss_start": None, "heldout_loss_end": None,
            "run_dir": "r", "checkpoint": None, "source_tokens": {}, "phases": [],
            "skipped_steps": 0}


def _session(cfg, start: int, step: int):
    return types.SimpleNamespace(
        cfg=cfg, start_step=start, state=RunState(step=step), model=[], run_dir="r",
        train_batches=types.SimpleNamespace(source_tokens={}))


def test_a_resumed_runs_summary_says_it_covers_this_launchs_steps(monkeypatch):
    import trainer.summary

    monkeypatch.setattr(trainer.summary, "model_parameter_count", lambda model: 1)
    cfg = _cfg("train.train_iters=80")
    summary = trainer.summary.build_summary(_session(cfg, 40, 80), _history(steps=40))
    assert summary["covers"] == "steps 41-80 of 80 (this launch; resumed from step 40)"
    assert (summary["first_step"], summary["last_step"], summary["resumed_from"]) == (41, 80, 40)
    assert summary["steps"] == 40 and summary["tokens_seen"] == 40 * 8 * 128
    assert "steps covered" in _printed(summary) and "resumed from step 40" in _printed(summary)
    fresh = trainer.summary.build_summary(_session(cfg, 0, 80), _history(steps=80))
    assert fresh["covers"] == "steps 1-80 of 80" and fresh["resumed_from"] is None


def test_the_steps_covered_in_words():
    from trainer.summary import covered_steps

    assert covered_steps(0, 80, 80) == "steps 1-80 of 80"
    assert covered_steps(40, 80, 80) == "steps 41-80 of 80 (this launch; resumed from step 40)"
    assert covered_steps(0, 40, 80) == "steps 1-40 of 80 (this launch)"  # a phase relaunches
    assert covered_steps(80, 80, 80) == "none (this launch; resumed from step 80)"


def test_the_summary_keeps_tokens_seen_and_loss_tokens_apart(monkeypatch):
    """Tokens seen: samples x sequence length, padding included; loss tokens: those that carry
    loss, which effective tokens/s counts."""
    import trainer.summary

    monkeypatch.setattr(trainer.summary, "model_parameter_count", lambda model: 1)
    cfg = _cfg("train.train_iters=4")
    summary = trainer.summary.build_summary(_session(cfg, 0, 4), _history(loss_tokens=900))
    assert summary["tokens_seen"] == 4 * 8 * 128 and summary["loss_tokens"] == 4 * 900
    printed = _printed(summary)
    assert "tokens seen (samples x seq length, with padding)" in printed
    assert "loss tokens (what tokens/s counts)" in printed


# ---- 5. the stop is recorded at the step the loop finished and saved -------------------------

def test_a_stop_is_recorded_at_the_step_it_saved_past_the_last_log_line(tmp_path, monkeypatch):
    """A guard: with `logging.log_interval=5` a stop agreed after step 7 settles steps 6-7 and
    records the stop, and its checkpoint, at step 7; the launcher's line names step 7."""
    import trainer.loop
    from trainer.entry.pipeline import stopped_line
    from trainer.metrics import RunReporter

    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    cfg = _cfg("train.train_iters=20", "logging.log_interval=5", "checkpoint.save=true",
               "checkpoint.save_interval=100", "checkpoint.save_on_stop=true")
    session = types.SimpleNamespace(cfg=cfg, state=RunState(), eval_steps=0, run_dir=tmp_path)
    span = types.SimpleNamespace(index=0, start_step=0)
    session.train_batches = types.SimpleNamespace(spans=[span], phase_at=lambda step: span)
    session.plugins = types.SimpleNamespace(after_update=lambda step: None,
                                            after_step=lambda metrics: None)

    def run_step(session):
        session.state.step += 1
        return types.SimpleNamespace(step=session.state.step, grad_norm=1.0, skipped=False)

    def settle(session, pending):
        return [StepMetrics(step=r.step, loss=2.0, lr=1e-3, grad_norm=1.0, loss_tokens=10,
                            step_time_s=1.0) for r in pending]

    def save(session, where):
        folder = where / f"step_{session.state.step:07d}"
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text("{}")
        return folder

    monkeypatch.setattr(trainer.loop, "run_step", run_step)
    monkeypatch.setattr(trainer.loop, "settle_steps", settle)
    monkeypatch.setattr(trainer.loop, "save_checkpoint", save)
    stop = types.SimpleNamespace(begin_step=lambda: None, agreed=0)
    stop.end_step = lambda: setattr(stop, "agreed", signal.SIGINT if session.state.step == 7
                                    else 0)
    reporter = RunReporter(tmp_path, total_steps=20, log_interval=5, progress_bar=False)
    graphs = types.SimpleNamespace(before_step=lambda step: None)
    trainer.loop._steps(session, reporter, lambda step: None, stop, RunHistory(), 20, graphs)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 8))
    assert records[-1] == {"kind": "stopped", "step": 7, "signal": "SIGINT",
                           "checkpoint": str(tmp_path / "checkpoints" / "step_0000007")}
    assert stopped_line(tmp_path, cfg, signal.SIGINT).startswith(
        "stopped by Ctrl-C (SIGINT) after step 7 of 20; every rank ended; saved "
        f"{tmp_path / 'checkpoints' / 'step_0000007'} at the stop")

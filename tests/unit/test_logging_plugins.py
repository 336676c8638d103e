"""The logging and profiler plugins without a process group: which scalars are logged (every
numeric field, found generically), W&B's choice of mode and its offline fallback, a failing
writer never stopping a run, rank 0 only, the loss-curve PNG, compare_runs, the profiler's rules.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.logging import writers
from plugins.logging.config import LoggingConfig
from plugins.logging.curves import Curves, plot_curves, read_run
from plugins.logging.plugin import LoggingPlugin
from plugins.logging.scalars import numeric_fields, tagged
from plugins.profiler.config import check_profiler_window
from plugins.protocol.errors import ConfigError, UserError
from plugins.protocol.events import EvalResult, RunStart, StepMetrics
from recipes.resolve import resolve_config
from tests.dist.wandb_records import wait_for_history
from tests.hang import HANG_S
from trainer.throughput import RUN_RULES, check_profile_windows, trainer_profiled_steps

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _metrics(step: int = 3, **extra: float) -> StepMetrics:
    return StepMetrics(step=step, loss=2.5, lr=1e-3, grad_norm=0.5, loss_tokens=100,
                       step_time_s=0.25, extra=dict(extra))


def test_every_numeric_field_property_and_extra_figure_is_a_scalar():
    scalars = tagged("train", _metrics(moe_imbalance=1.25))
    assert scalars["train/loss"] == 2.5 and scalars["train/lr"] == 1e-3
    assert scalars["train/tokens_per_s"] == 400.0  # a property, found without naming it
    assert scalars["train/moe_imbalance"] == 1.25  # a plugin's figure
    assert scalars["train/skipped"] == 0.0
    assert "train/step" not in scalars and "train/extra" not in scalars


def test_a_field_added_to_the_metrics_later_is_logged_without_a_change():
    @dataclasses.dataclass
    class Richer(StepMetrics):
        mfu: float | None = None
        peak_memory_gib: float = 0.0

    figures = numeric_fields(Richer(step=1, loss=1.0, lr=0.1, grad_norm=1.0, loss_tokens=4,
                                    step_time_s=1.0, mfu=0.41, peak_memory_gib=3.5))
    assert figures["mfu"] == 0.41 and figures["peak_memory_gib"] == 3.5
    unknown = Richer(step=1, loss=1.0, lr=0.1, grad_norm=float("nan"), loss_tokens=4,
                     step_time_s=1.0)
    assert "mfu" not in numeric_fields(unknown)  # None: not known, not logged as 0
    assert "grad_norm" not in numeric_fields(unknown)  # NaN (skipped update) is left out
    assert tagged("heldout", EvalResult(step=2, loss=3.0, loss_tokens=9)) == {
        "heldout/loss": 3.0, "heldout/loss_tokens": 9.0}


def test_wandb_auto_is_online_only_with_an_api_key(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert not writers.wandb_api_key_found()
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert writers.wandb_api_key_found()
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert writers.wandb_api_key_found()


def test_wandb_that_cannot_go_online_logs_offline_into_the_run_dir(monkeypatch, tmp_path):
    real_init, modes = writers.WandbWriter._init, []

    def init(mode: str, args: dict):
        modes.append(mode)
        if mode == "online":
            raise ConnectionError("api.wandb.ai unreachable\nmore detail")
        return real_init(mode, args)

    monkeypatch.setattr(writers.WandbWriter, "_init", staticmethod(init))
    writer = writers.WandbWriter(tmp_path, "online", "p", "run", {"a": 1})
    assert modes == ["online", "offline"] and writer.mode == "offline"
    assert writer.note == ("wandb: online logging failed (ConnectionError: api.wandb.ai "
                           "unreachable); logging offline")
    writer.log({"train/loss": 2.0}, 1)
    writer.log({"train/loss": 1.5}, 2)
    writer.close()
    rows = wait_for_history(tmp_path, rows=2)
    assert [(row["_step"], row["train/loss"]) for row in rows] == [(1, 2.0), (2, 1.5)]


class _Broken:
    path = "nowhere"

    def log(self, scalars, step):
        raise OSError("disk full")


def _start(plugin: LoggingPlugin, run_dir: Path) -> None:
    plugin.run_start(RunStart(config=None, run_dir=run_dir, start_step=0, total_steps=2))


def test_a_failing_writer_is_dropped_with_one_line_and_the_run_goes_on(tmp_path, capsys):
    plugin = LoggingPlugin(LoggingConfig(loss_curve=False))
    _start(plugin, tmp_path)
    plugin.writers.append(_Broken())
    plugin.after_step(_metrics(step=1))
    plugin.after_step(_metrics(step=2))  # no second complaint: the writer is gone
    assert plugin.writers == []
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["_Broken: log failed (OSError: disk full); the run continues without it"]


def test_only_rank_zero_writes(monkeypatch, tmp_path):
    def run(rank_zero: bool, run_dir: Path) -> list[str]:
        """What one rank's plugin leaves in its run dir after a step and the run's end."""
        run_dir.mkdir()
        monkeypatch.setattr("plugins.logging.plugin._is_rank_zero", lambda: rank_zero)
        plugin = LoggingPlugin(LoggingConfig(tensorboard=True, wandb="offline"))
        _start(plugin, run_dir)
        plugin.after_step(_metrics(step=1))
        plugin.run_end({})
        return sorted(path.name for path in run_dir.iterdir())

    # The control: rank zero with the same config writes every file, so the writers exist.
    zero = tmp_path / "rank0"
    assert run(True, zero) == ["loss_curve.png", "tensorboard", "wandb"]
    assert list((zero / "tensorboard").glob("events.out.tfevents.*"))
    assert list((zero / "wandb").glob("offline-run-*"))
    assert run(False, tmp_path / "rank1") == []


def test_the_loss_curve_is_drawn_at_run_end(tmp_path):
    plugin = LoggingPlugin(LoggingConfig())
    _start(plugin, tmp_path)
    plugin.after_eval(EvalResult(step=0, loss=5.0, loss_tokens=10))
    for step in (1, 2):
        plugin.after_step(_metrics(step=step))
    plugin.after_eval(EvalResult(step=2, loss=2.0, loss_tokens=10))
    plugin.run_end({"recipe": "tiny"})
    assert (tmp_path / "loss_curve.png").read_bytes().startswith(PNG)


def test_a_resumed_runs_curve_is_the_whole_run_from_its_metrics(tmp_path):
    """A run resumed at step 3 hears steps 4 and 5 only; its metrics.jsonl holds 1-5 and the
    held-out losses of both starts. The picture is drawn from the file: all of them (without
    a metrics.jsonl, as for a command that keeps none: what it heard)."""
    records = [{"kind": "heldout", "step": 0, "loss": 5.0},
               *({"kind": "train", "step": s, "loss": 6.0 - s, "lr": 1e-3} for s in range(1, 6)),
               {"kind": "heldout", "step": 5, "loss": 1.5}]
    plugin = LoggingPlugin(LoggingConfig())
    _start(plugin, tmp_path)
    for step in (4, 5):
        plugin.after_step(_metrics(step=step))
    assert [step for step, _ in plugin.whole_run().train_loss] == [4, 5]  # no file yet
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    whole = plugin.whole_run()
    assert whole.train_loss == [(s, 6.0 - s) for s in range(1, 6)]
    assert whole.heldout_loss == [(0, 5.0), (5, 1.5)] and whole.name == tmp_path.name
    plugin.run_end({})
    expected = plot_curves([whole], tmp_path / "expected.png", tmp_path.name)
    assert (tmp_path / "loss_curve.png").read_bytes() == expected.read_bytes()


def test_logging_config_is_built_only_when_something_is_on_and_names_missing_packages(
        monkeypatch):
    cfg = resolve_config(["recipe=tiny_dp1"])
    assert not LoggingConfig(loss_curve=False).active(cfg) and LoggingConfig().active(cfg)
    assert isinstance(LoggingConfig().build(), LoggingPlugin)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert LoggingConfig(wandb="auto").machine_problem(None, None, True) == (
        "plugins.logging.wandb=auto needs the wandb package, which is not installed; install "
        "it with `pip install -e '.[wandb]'` or set plugins.logging.wandb=off")
    assert LoggingConfig().machine_problem(None, None, True) is None


def _write_run(run_dir: Path, losses: list[float]) -> Path:
    run_dir.mkdir(parents=True)
    records = [{"kind": "heldout", "step": 0, "loss": 6.0}]
    records += [{"kind": "train", "step": i + 1, "loss": loss, "lr": 1e-3, "extra": {}}
                for i, loss in enumerate(losses)]
    records.append({"kind": "summary", "recipe": "tiny"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_read_run_takes_train_and_heldout_records(tmp_path):
    curves = read_run(_write_run(tmp_path / "a", [5.0, 4.0]))
    assert curves.train_loss == [(1, 5.0), (2, 4.0)] and curves.heldout_loss == [(0, 6.0)]
    assert curves.lr == [(1, 1e-3), (2, 1e-3)] and curves.name == "a"


def test_read_run_refuses_what_is_not_a_run_in_one_line(tmp_path):
    with pytest.raises(UserError, match="has no metrics.jsonl"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train"}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:1 is not a metrics record"):
        read_run(tmp_path)


def test_plot_curves_overlays_runs(tmp_path):
    runs = [Curves("a", [(1, 3.0), (2, 2.0)], [(2, 2.5)], [(1, 1e-3), (2, 5e-4)]),
            Curves("b", [(1, 3.5), (2, float("nan"))], [], [(1, 1e-3), (2, 1e-3)])]
    assert plot_curves(runs, tmp_path / "x" / "c.png", "a vs b").read_bytes().startswith(PNG)


def _compare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=HANG_S)


def test_compare_runs_overlays_run_dirs_and_refuses_in_one_line(tmp_path):
    a, b = _write_run(tmp_path / "a", [5.0, 4.0]), _write_run(tmp_path / "b", [5.5, 4.5])
    result = _compare(str(a), str(b), "out=both.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "both.png").read_bytes().startswith(PNG)
    bad = _compare(str(a), str(tmp_path / "missing"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"error: {tmp_path / 'missing'} has no metrics.jsonl")


def test_profiler_window_rules():
    def cfg(*overrides: str):
        return resolve_config(["recipe=tiny_dp1", "plugins.profiler.enabled=true", *overrides],
                              rules=RUN_RULES)

    assert check_profiler_window(cfg()) is None  # default window 5-6 of 300 steps
    with pytest.raises(ConfigError, match=r"plugins.profiler.steps=0 must be at least 1"):
        cfg("plugins.profiler.steps=0")
    with pytest.raises(ConfigError, match=r"profiles up to step 11, past train.train_iters=10"):
        cfg("train.train_iters=10", "scheduler.warmup_iters=1", "plugins.profiler.start_step=10",
            "plugins.profiler.steps=2")
    assert trainer_profiled_steps(0, 300, exposed_comm=False) == set()
    own = sorted(trainer_profiled_steps(0, 300, exposed_comm=True))
    assert own == [2, 3]  # with logging.exposed_comm the trainer profiles these itself
    assert check_profiler_window(cfg("plugins.profiler.start_step=2")) is None
    with pytest.raises(ConfigError, match="plugins.profiler profiles steps 2-3, which overlaps "
                       "steps 2-3.*set plugins.profiler.start_step=4.*logging.exposed_comm=false"):
        cfg("plugins.profiler.start_step=2", "logging.exposed_comm=true")
    assert check_profile_windows(cfg("plugins.profiler.start_step=4",
                                     "logging.exposed_comm=true")) is None


def test_profiler_traces_exactly_its_window(tmp_path):
    import torch

    from plugins.profiler.config import ProfilerConfig

    cfg = resolve_config(["recipe=tiny_dp1"])  # exposed_comm off
    assert not ProfilerConfig().active(cfg)  # off by default: nothing is built
    plugin = ProfilerConfig(enabled=True, start_step=2, steps=2).build()
    plugin.run_start(RunStart(config=cfg, run_dir=tmp_path, start_step=0, total_steps=4))
    for step in range(1, 5):
        with torch.profiler.record_function(f"work of step {step}"):
            torch.ones(8) @ torch.ones(8)
        plugin.after_update(step)  # as the update happens, not when the loop sums figures
        assert (plugin.profiler is not None) == (step in (1, 2))  # runs for steps 2 and 3
    traces = list((tmp_path / "profile").glob("rank0.steps2-3.*.pt.trace.json"))
    names = {event.get("name") for event in json.loads(traces[0].read_text())["traceEvents"]}
    assert {"work of step 2", "work of step 3"} <= names
    assert not names & {"work of step 1", "work of step 4"}


def test_profiler_stands_aside_for_the_trainers_own_profiled_steps(tmp_path, capsys):
    """A resumed run moves the trainer's profiled steps; the plugin hears them in RunStart and
    traces nothing rather than leaving the trainer's profiler without events."""
    from plugins.profiler.config import ProfilerConfig

    plugin = ProfilerConfig(enabled=True, start_step=12, steps=2).build()
    cfg = resolve_config(["recipe=tiny_dp1"])
    own = trainer_profiled_steps(10, 20, exposed_comm=True)
    assert own == {12, 13}
    plugin.run_start(RunStart(config=cfg, run_dir=tmp_path, start_step=10, total_steps=20,
                              profiled_steps=own))
    assert plugin.trace_dir is None
    assert "overlap steps [12, 13] that the trainer profiles itself" in capsys.readouterr().err


def test_tokens_per_source_are_one_scalar_each():
    metrics = dataclasses.replace(_metrics(), source_tokens={"web": 300, "code": 100})
    scalars = tagged("train", metrics)
    assert scalars["train/source_tokens/web"] == 300.0
    assert scalars["train/source_tokens/code"] == 100.0
    assert "train/source_tokens" not in scalars


def _png_height(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")  # IHDR: width, then height


def test_phase_boundaries_and_source_shares_reach_the_curve(tmp_path):
    run_dir = tmp_path / "phased"
    run_dir.mkdir()
    records = [{"kind": "train", "step": step, "loss": 5.0 - step / 10, "lr": 1e-3,
                "phase_name": "general" if step <= 3 else "quality",
                "source_tokens": {"web": 128 * min(step, 3) * 8,
                                  "code": 128 * max(0, step - 3) * 8}}
               for step in range(1, 7)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    curves = read_run(run_dir)
    assert curves.boundaries == [(0, "general"), (3, "quality")]
    assert curves.source_shares["code"][-1] == (6, 0.5)
    phased = plot_curves([curves], tmp_path / "phased.png", "phases")
    single = plot_curves([Curves("a", [(1, 3.0)], [], [(1, 1e-3)])], tmp_path / "a.png", "a")
    assert _png_height(phased) > _png_height(single)  # the token-share panel below


def test_summary_has_one_row_per_phase():
    from trainer.summary import phase_rows

    cfg = resolve_config(["recipe=tiny_dp1", "train.train_iters=20", "scheduler.warmup_iters=2",
                          "phases=[{name: a, end_step: 12}, {name: b, end_step: 20, "
                          "global_batch_size: 16}]"])
    rows = phase_rows(cfg)
    assert [(r["phase"], r["steps"], r["global_batch"]) for r in rows] == [
        ("a", "0-12", 8), ("b", "12-20", 16)]
    assert [r["tokens"] for r in rows] == [12 * 8 * 128, 8 * 16 * 128]
    assert [r["tokens"] for r in phase_rows(cfg, start_step=15)] == [0, 5 * 16 * 128]
    assert [r["tokens"] for r in phase_rows(cfg, 0, end_step=12)] == [12 * 8 * 128, 0]

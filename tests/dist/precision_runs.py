"""Per-rank functions for the fp16 loss-scaling tests (run through the `launch_ranks` fixture).

`train_recording_scaler` runs the real step loop (`trainer.loop.run_training`: skipped-update
counting, checkpoints when due) and records what the optimizer's loss scaler and the lr
scheduler hold right after every update (the `after_update` hook), beside the step's figures
(the `after_step` hook, which hears them once the loop has summed them).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from plugins.protocol.events import StepMetrics
from plugins.protocol.hooks import Plugin
from recipes.resolve import resolve_config
from trainer.checkpoint.preflight import validate_paths

# Small, machine-independent data and no held-out evaluation: losses depend on numerics only.
TEST_DATA = ["data.source=synthetic", "data.max_corpus_bytes=120000", "train.eval_iters=0",
             "train.eval_interval=0"]


def scaler_state(optimizer) -> dict:
    """The grad scaler's state as Megatron checkpoints it (optimizer/grad_scaler.py:155-160)."""
    inner = getattr(optimizer, "chained_optimizers", [optimizer])[0]
    scaler = inner.grad_scaler
    return {"scale": float(scaler.scale), "growth_tracker": scaler._growth_tracker,
            "hysteresis_tracker": scaler._hysteresis_tracker}


class StepRecorder(Plugin):
    """Test-only plugin: per step, the metrics the loop saw and the scaler/scheduler after it."""

    name = "step_recorder"

    def __init__(self, session) -> None:
        self.session = session
        self.steps: list[dict] = []
        self.after_updates: dict[int, dict] = {}

    def after_update(self, step: int) -> None:
        self.after_updates[step] = {"scheduler_steps": self.session.scheduler.num_steps,
                                    **scaler_state(self.session.optimizer)}

    def after_step(self, metrics: StepMetrics) -> None:
        self.steps.append({
            "step": metrics.step, "loss": metrics.loss, "lr": metrics.lr,
            "skipped": metrics.skipped, **self.after_updates.pop(metrics.step),
        })


def train_recording_scaler(payload: dict) -> dict:
    """Train to `train.train_iters` through the step loop; per-step records and the end state."""
    from megatron.core import parallel_state

    from trainer.loop import run_training
    from trainer.metrics import RunReporter
    from trainer.session import start_session

    cfg = resolve_config([f"recipe={payload['recipe']}", *TEST_DATA, *payload["overrides"]])
    validate_paths(cfg)
    cfg.logging.progress_bar = False
    session = start_session(cfg, Path(payload["run_dir"]))
    loaded = scaler_state(session.optimizer)
    recorder = StepRecorder(session)
    session.plugins.plugins.append(recorder)
    # The loop's log lines go to this rank's stderr file: a forked rank shares the fork
    # server's stdout, which carries its replies (tests/dist/fork_server.py).
    with contextlib.redirect_stdout(sys.stderr), RunReporter(
        session.run_dir, cfg.train.train_iters, 1, False
    ) as reporter:
        run_training(session, reporter)
    state = session.state
    parallel_state.destroy_model_parallel()
    return {"start": session.start_step, "loaded": loaded, "steps": recorder.steps,
            "skipped_steps": state.skipped_steps,
            "consumed": [state.consumed_samples, state.consumed_tokens]}

"""Runs torch.profiler over a window of steps and writes the trace when the window closes.

The profiler starts in `after_update` of the step before the window (in `run_start` when the
window starts at the first step) and stops in `after_update` of the window's last step, so it
sees whole steps: the trainer's `data wait`, `forward-backward` and `optimizer` ranges
(`trainer/step.py`), everything under them, and the hooks, evaluation and checkpoint between
steps. The trace is written by torch's `tensorboard_trace_handler`: a `.pt.trace.json` file that
Perfetto (ui.perfetto.dev), chrome://tracing and TensorBoard's profile plugin open.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from plugins.protocol.events import RunStart
from plugins.protocol.hooks import Plugin

TRACE_DIR = "profile"


def _activities() -> list[Any]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


class ProfilerPlugin(Plugin):
    def __init__(self, config: Any) -> None:  # the plugin's ProfilerConfig
        self.config = config
        self.first = config.start_step
        self.last = config.start_step + config.steps - 1
        self.profiler: Any = None
        self.trace_dir: Path | None = None  # None on ranks that do not trace

    def run_start(self, start: RunStart) -> None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if rank != 0 and not self.config.all_ranks:
            return
        if start.start_step >= self.first:  # resumed past the window: nothing to trace
            return
        clash = sorted(s for s in start.profiled_steps if self.first <= s <= self.last)
        if clash:  # a resumed run moves the trainer's own profiled steps
            print(f"profiler: steps {self.first}-{self.last} overlap steps {clash} that the "
                  "trainer profiles itself; no trace (move plugins.profiler.start_step)",
                  file=sys.stderr, flush=True)
            return
        self.trace_dir = Path(start.run_dir) / TRACE_DIR
        self.worker = f"rank{rank}"
        if start.start_step == self.first - 1:
            self._start()

    def _start(self) -> None:
        handler = torch.profiler.tensorboard_trace_handler(
            str(self.trace_dir), worker_name=f"{self.worker}.steps{self.first}-{self.last}")
        self.profiler = torch.profiler.profile(
            activities=_activities(), record_shapes=self.config.record_shapes,
            with_stack=self.config.with_stack, on_trace_ready=handler)
        self.profiler.start()

    def _stop(self) -> None:
        self.profiler.stop()  # calls the handler: writes the trace
        self.profiler = None
        print(f"profiler: steps {self.first}-{self.last} traced into {self.trace_dir}",
              file=sys.stderr, flush=True)

    def after_update(self, step: int) -> None:
        if self.trace_dir is None:
            return
        if step == self.first - 1:
            self._start()
        elif step == self.last and self.profiler is not None:
            self._stop()

    def run_end(self, summary: dict[str, Any]) -> None:
        if self.profiler is not None:  # the run stopped inside the window
            self._stop()

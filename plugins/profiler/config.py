"""Config of the profiler plugin (torch-free): the window of steps traced, and its rules.

A plugin because profiling is occasional and must cost nothing when off or outside its window:
the plugin is not even built unless `plugins.profiler.enabled=true`, and outside the window its
hook compares two integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol import Plugin, PluginConfig, Rule, profiled_steps


def trainer_profiled_steps(start_step: int, total_steps: int, exposed_comm: bool) -> set[int]:
    """Step numbers the trainer itself runs under torch.profiler to measure exposed
    communication when the run asks for it (`logging.exposed_comm`; `profiled_steps` in
    plugins/protocol.py). torch allows one profiler at a time: a second one started inside the
    first leaves the first with no events, so the window must avoid them."""
    return {start_step + 1 + index
            for index in profiled_steps(total_steps - start_step, exposed_comm=exposed_comm)}


def window_clash(first: int, last: int, start_step: int, total_steps: int,
                 exposed_comm: bool) -> list[int]:
    """The trainer's own profiled steps inside the window first..last, in order."""
    return sorted(s for s in trainer_profiled_steps(start_step, total_steps, exposed_comm)
                  if first <= s <= last)


def check_profiler_window(cfg: Any) -> str | None:
    """The window must lie inside the run: steps start_step .. start_step + steps - 1."""
    p = cfg.plugins.profiler
    if not p.enabled:
        return None
    if p.start_step < 1 or p.steps < 1:
        field, value = ("start_step", p.start_step) if p.start_step < 1 else ("steps", p.steps)
        return f"plugins.profiler.{field}={value} must be at least 1, e.g. {field}=2"
    last, total = p.start_step + p.steps - 1, cfg.train.train_iters
    if last > total:
        return (f"plugins.profiler.start_step={p.start_step} with steps={p.steps} profiles up to "
                f"step {last}, past train.train_iters={total}; lower plugins.profiler.start_step")
    exposed = cfg.logging.exposed_comm
    clash = window_clash(p.start_step, last, 0, total, exposed)
    if clash:
        after = max(trainer_profiled_steps(0, total, exposed)) + 1
        return (f"plugins.profiler.start_step={p.start_step} with steps={p.steps} overlaps steps "
                f"{clash[0]}-{clash[-1]}, which the trainer profiles itself to measure exposed "
                f"communication (logging.exposed_comm=true; torch runs one profiler at a time); "
                f"set plugins.profiler.start_step={after} or later, or logging.exposed_comm=false")
    return None


@dataclass(kw_only=True)
class ProfilerConfig(PluginConfig):
    """torch.profiler over steps start_step .. start_step + steps - 1 (CPU, and CUDA where
    available), one Chrome trace per profiled rank in `<run dir>/profile/`."""

    enabled: bool = False  # off by default: nothing is built, nothing runs
    start_step: int = 5  # first profiled step (1-based; after warm-up, and after steps 2-3
    # that the trainer profiles itself with logging.exposed_comm=true)
    steps: int = 2  # steps in the window
    all_ranks: bool = False  # trace every rank, not only rank 0
    record_shapes: bool = False  # input shapes of each operator (larger trace)
    with_stack: bool = False  # Python stacks of each operator (much larger trace)

    def rules(self) -> tuple[Rule, ...]:
        return (check_profiler_window,)

    def build(self) -> Plugin | None:
        if not self.enabled:
            return None
        from plugins.profiler.plugin import ProfilerPlugin

        return ProfilerPlugin(self)

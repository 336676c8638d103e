"""Config of the profiler plugin (torch-free): the window of steps traced, and its rules.

A plugin because profiling is occasional and must cost nothing when off or outside its window:
the plugin is not even built unless `plugins.profiler.enabled=true`, and outside the window its
hook compares two integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol.hooks import Plugin, PluginConfig, ProfileWindow, Rule


def check_profiler_counts(cfg: Any) -> str | None:
    """Steps are counted from 1 and a window holds at least one: a step 0 or below, or an empty
    window, is refused whether the profiler is on or not (a saved config switched on later
    would only then find out)."""
    p = cfg.plugins.profiler
    for field in ("start_step", "steps"):
        value = getattr(p, field)
        if value < 1:
            return (f"plugins.profiler.{field}={value} must be at least 1; set it, e.g. "
                    f"plugins.profiler.{field}={getattr(type(p), field)}")
    return None


def check_profiler_window(cfg: Any) -> str | None:
    """The window must lie inside the run: steps start_step .. start_step + steps - 1 (its
    counts themselves are `check_profiler_counts`')."""
    p = cfg.plugins.profiler
    if not p.enabled or p.start_step < 1 or p.steps < 1:
        return None
    last, total = p.start_step + p.steps - 1, cfg.train.train_iters
    if last > total:
        return (f"plugins.profiler.start_step={p.start_step} with steps={p.steps} profiles up to "
                f"step {last}, past train.train_iters={total}; lower plugins.profiler.start_step")
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
        return (check_profiler_counts, check_profiler_window)

    def profile_window(self, cfg: Any) -> ProfileWindow | None:
        if not self.enabled:
            return None
        return ProfileWindow(self.start_step, self.start_step + self.steps - 1,
                             "plugins.profiler.start_step")

    def active(self, cfg: Any) -> bool:
        return self.enabled

    def build(self) -> Plugin | None:
        from plugins.profiler.plugin import ProfilerPlugin

        return ProfilerPlugin(self)

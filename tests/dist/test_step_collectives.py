"""The loop's steps run no collective of ours that a rank waits on, beside Megatron's own: every
step starts the stop flags' sum without waiting (read when the step ends) and, on CPU ranks,
meets at the barrier before its clock; the figures of the steps since the last are summed at
the log interval (one sum and one maximum over the world). Recorded from the real loop
(`trainer.loop.run_training`) on two ranks, by wrapping torch.distributed's collectives and
keeping the calls made from the trainer's own modules (the CPU runtime's, which carry
Megatron's calls, aside)."""

from __future__ import annotations

import sys
from pathlib import Path

ENTRY = "tests.dist.test_step_collectives:collectives_of_the_loop"
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier")


def _ours(module: str) -> bool:
    return module.startswith(("trainer.", "plugins.", "recipes.")) and not module.startswith(
        "trainer.cpu_runtime")


def collectives_of_the_loop(payload: dict) -> list[list[str]]:
    """Run the loop; per optimizer update, the collectives of ours called since the one before
    (the caller's qualified name, `async` for one not waited on where it is called)."""
    import contextlib

    import torch

    from plugins.protocol.hooks import Plugin
    from recipes.resolve import resolve_config
    from tests.dist.layout_runs import TEST_DATA, _finish
    from trainer.checkpoint.preflight import validate_paths
    from trainer.loop import run_training
    from trainer.metrics import RunReporter
    from trainer.session import start_session

    cfg = resolve_config(["recipe=tiny_dp2", *TEST_DATA, *payload["overrides"]])
    validate_paths(cfg)
    cfg.logging.progress_bar = False
    session = start_session(cfg, Path(payload["run_dir"]))
    segments: list[list[str]] = [[]]

    class Updates(Plugin):
        name = "updates"

        def after_update(self, step: int) -> None:
            segments.append([])

    session.plugins.plugins.append(Updates())

    def recording(name, call):
        def wrapper(*args, **kwargs):
            frame = sys._getframe(1)
            if _ours(frame.f_globals.get("__name__", "")):
                segments[-1].append(f"{frame.f_code.co_qualname}:{name}"
                                    + (" async" if kwargs.get("async_op") else ""))
            return call(*args, **kwargs)
        return wrapper

    with contextlib.ExitStack() as stack:
        for name in COLLECTIVES:
            original = getattr(torch.distributed, name)
            setattr(torch.distributed, name, recording(name, original))
            stack.callback(setattr, torch.distributed, name, original)
        with contextlib.redirect_stdout(sys.stderr), RunReporter(
                session.run_dir, cfg.train.train_iters, cfg.logging.log_interval, False) as log:
            run_training(session, log)
    _finish()
    return segments


def test_a_step_waits_on_no_collective_of_ours_and_figures_are_summed_at_the_log_interval(
        launch_ranks, tmp_path):
    results = launch_ranks(2, ENTRY, {"run_dir": str(tmp_path), "overrides": [
        "train.train_iters=8", "scheduler.warmup_iters=2", "logging.log_interval=4",
        "train.eval_interval=0",
        "train.eval_iters=0", "checkpoint.save=false"]})
    step = ["LaterWorldSum.__init__:all_reduce async", "run_step:barrier"]
    summed = ["sum_over_world:all_reduce", "max_over_world:all_reduce"]
    # Before update 1, between the updates, after update 8: log lines at steps 4 and 8.
    expected = [step, step, step, step, summed + step, step, step, step, summed]
    assert results[0] == results[1] == expected

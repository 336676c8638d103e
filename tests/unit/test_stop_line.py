"""The one line a stopped run ends with (`pipeline.stopped_line`), from what the run left on disk,
and which signals a run stops at a step boundary for (`loop.stop_signals`)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from trainer.entry.pipeline import stopped_line

CFG = apply_overrides(get_recipe("tiny_dp2"), ["train.train_iters=50"])
LATER = CFG.logging.log_interval - 1


def _run(run_dir: Path, records: list[dict], steps: tuple[int, ...] = ()) -> Path:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records)
                                           + '{"kind": "tra')  # a line cut by the kill
    for step in steps:  # complete checkpoints: a step directory with Megatron's marker
        folder = run_dir / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text("{}")
    return run_dir


def test_the_stop_line_names_the_signal_the_step_and_what_to_continue_from(tmp_path):
    trained = [{"kind": "train", "step": s} for s in range(1, 8)]
    run_dir = _run(tmp_path / "saved", [*trained, {"kind": "stopped", "step": 7,
                                                   "signal": "SIGINT", "checkpoint": "/c/7"}],
                   steps=(5, 7))
    resume = (f"; continue with: python scripts/pretrain.py config={run_dir / 'config.yaml'} "
              f"run_dir={run_dir} checkpoint.resume=true")
    assert stopped_line(run_dir, CFG, signal.SIGINT) == (
        "stopped by Ctrl-C (SIGINT) after step 7 of 50; every rank ended; saved /c/7 at the "
        "stop" + resume)
    # not asked to save: the newest checkpoint, and how to get one at the stop
    run_dir = _run(tmp_path / "older", trained, steps=(5,))
    assert stopped_line(run_dir, CFG, signal.SIGTERM) == (
        f"stopped by SIGTERM after step 7 of 50 (the last logged; up to {LATER} later steps may "
        f"have run); every rank ended; the newest checkpoint is "
        f"{run_dir / 'checkpoints' / 'step_0000005'} (checkpoint.save_on_stop=true saves one "
        f"at a stop); continue with: python scripts/pretrain.py config="
        f"{run_dir / 'config.yaml'} run_dir={run_dir} checkpoint.resume=true")
    run_dir = _run(tmp_path / "none", trained[:2])
    assert stopped_line(run_dir, CFG, signal.SIGINT) == (
        f"stopped by Ctrl-C (SIGINT) after step 2 of 50 (the last logged; up to {LATER} later "
        "steps may have run); every rank ended; no checkpoint was "
        "saved (checkpoint.save_interval=N, or checkpoint.save_on_stop=true at a stop)")


def test_a_run_stopped_before_it_logged_a_step_says_so(tmp_path):
    assert stopped_line(_run(tmp_path / "early", []), CFG, signal.SIGTERM) == (
        "stopped by SIGTERM before any of its 50 steps was logged; every rank ended; no "
        "checkpoint was saved (checkpoint.save_interval=N, or checkpoint.save_on_stop=true at "
        "a stop)")


def test_sigterm_waits_for_the_step_boundary_only_when_something_is_saved_on_the_way_out():
    from trainer.loop import stop_signals

    assert stop_signals(CFG) == (signal.SIGINT,)  # SIGTERM: the ranks end at once, as before
    for asked in ("checkpoint.save_on_stop=true", "checkpoint.async_save=true"):
        cfg = apply_overrides(CFG, [asked])
        assert stop_signals(cfg) == (signal.SIGINT, signal.SIGTERM)


def test_every_rank_agrees_on_the_signal_any_rank_noted_through_the_summed_flags():
    """Each rank gives its flags, every rank gets their sum and stops for the same signal
    (SIGTERM before SIGINT when ranks differ)."""
    from trainer.loop import StopRequest

    ranks = [StopRequest() for _ in range(3)]
    assert [r.flags() for r in ranks] == [(0.0, 0.0)] * 3
    ranks[1].note(signal.SIGINT, None)

    def step() -> list[int]:
        summed = tuple(map(sum, zip(*(r.flags() for r in ranks), strict=True)))
        for r in ranks:
            r.agree(summed)
        return [r.agreed for r in ranks]

    assert step() == [signal.SIGINT] * 3
    ranks[2].note(signal.SIGTERM, None)
    assert step() == [signal.SIGTERM] * 3


class _ThreeRanks:
    """Stands in for `LaterWorldSum` over a world of three ranks that end each step in turn:
    the n-th sum a rank starts adds the flags of every rank's n-th."""

    def __init__(self):
        self.rounds: list[list[tuple[float, ...]]] = []
        self.started: dict[int, int] = {}

    def later_sum(self, rank: int):
        world = self

        class Started:
            def __init__(self, values):
                self.round = world.started.get(rank, 0)
                world.started[rank] = self.round + 1
                if len(world.rounds) <= self.round:
                    world.rounds.append([])
                world.rounds[self.round].append(values)

            def result(self):
                assert len(world.rounds[self.round]) == 3, "read before every rank gave its part"
                return tuple(map(sum, zip(*world.rounds[self.round], strict=True)))

        return Started


def test_every_rank_stops_after_the_same_step_the_one_whose_start_saw_the_signal(monkeypatch):
    """Each step starts a sum of the flags noted so far and reads it at its end (every rank
    gave its part by then): a signal noted between steps stops every rank after the next step,
    one noted during a step after the step that follows; the same step everywhere."""
    import trainer.loop
    from trainer.loop import StopRequest

    world, ranks = _ThreeRanks(), [StopRequest() for _ in range(3)]

    def step(noted_during: tuple[int, int] | None = None) -> list[int]:
        for rank, request in enumerate(ranks):
            monkeypatch.setattr(trainer.loop, "LaterWorldSum", world.later_sum(rank))
            request.begin_step()
        if noted_during:
            ranks[noted_during[0]].note(noted_during[1], None)
        for request in ranks:
            request.end_step()
            assert request.started is None
        return [request.agreed for request in ranks]

    assert step() == [0, 0, 0]
    assert step(noted_during=(2, signal.SIGTERM)) == [0, 0, 0]  # too late for this step's sum
    assert step() == [signal.SIGTERM] * 3
    ranks[1].note(signal.SIGINT, None)  # between steps: the next step's sum carries it
    assert step() == [signal.SIGTERM] * 3  # SIGTERM first when ranks noted different signals

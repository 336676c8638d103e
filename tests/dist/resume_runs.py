"""Per-rank functions for the resume and fault tests (run through the `launch_ranks` fixture).

A step's record is what "resumes exactly" means: its loss, the learning rate it applied, the
loss tokens consumed so far, and a digest of the token ids this rank trained on (the same
samples in the same order). Sessions are built as `scripts/pretrain.py` builds them
(tests/dist/layout_runs.py `_session`).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
from pathlib import Path

from tests.dist.layout_runs import _finish, _session


def _digest(microbatches: list) -> str:
    h = hashlib.sha256()
    for mb in microbatches:
        h.update(mb["tokens"].numpy().tobytes())
    return h.hexdigest()[:16]


def _expert_bias(session) -> str | None:
    """A digest of every router's aux-loss-free expert bias on this rank (None: no bias)."""
    buffers = [buffer for chunk in session.model for name, buffer in chunk.named_buffers()
               if name.endswith("expert_bias")]
    if not buffers:
        return None
    h = hashlib.sha256()
    for buffer in buffers:
        h.update(buffer.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]


def _step(session) -> dict:
    from trainer.step import train_step

    digest = _digest(session.train_batches.upcoming())
    metrics = train_step(session)
    return {"step": metrics.step, "loss": metrics.loss, "lr": metrics.lr,
            "tokens": session.state.consumed_tokens,
            "samples": session.state.consumed_samples, "data": digest,
            "phase": metrics.phase, "sources": metrics.source_tokens,
            "batch": metrics.global_batch, "expert_bias": _expert_bias(session),
            "mtp": {k: v for k, v in metrics.extra.items() if k.startswith("mtp_")}}


def _train(session, steps: int, save_at=(), root: Path | None = None,
           started: list | None = None) -> list[dict]:
    """As the run loop does: save after the steps in `save_at`, publish finished asynchronous
    saves after every step and all of them at the end. `started` gets, per save, what rank 0
    saw in `root` right after the save returned."""
    from trainer.checkpoint.async_save import finish_saves
    from trainer.checkpoint.save import save_checkpoint

    records = []
    while session.state.step < steps:
        records.append(_step(session))
        if session.state.step in save_at:
            final = save_checkpoint(session, root)
            if started is not None:
                latest = root / "latest"
                started.append({"step": session.state.step, "published": final.exists(),
                                "latest": latest.read_text() if latest.exists() else None})
        finish_saves(session, blocking=False)  # nothing to do unless saves are asynchronous
    finish_saves(session, blocking=True)
    return records


def continuous(payload: dict) -> dict:
    """The uninterrupted run: `steps` steps, saving full checkpoints after `save_at`."""
    session = _session(payload)
    records = _train(session, payload["steps"], set(payload.get("save_at", ())),
                     Path(payload.get("checkpoint_dir", ".")))
    _finish()
    return {"records": records}


def plain_then_async(payload: dict) -> dict:
    """In one launch: `steps` steps without saving, then the same run in a new session saving
    after `save_at` with the payload's overrides (checkpoint.async_save=true)."""
    plain = _session({**payload, "overrides": []})
    records = _train(plain, payload["steps"])
    _finish()
    session = _session(payload)
    started: list[dict] = []
    saving = _train(session, payload["steps"], set(payload["save_at"]),
                    Path(payload["checkpoint_dir"]), started)
    _finish()
    return {"plain": records, "async": saving, "started": started}


def die_during_async_write(payload: dict) -> dict:
    """Resume, train one step and save it asynchronously; rank `kill_rank` is SIGKILLed right
    after its writer started, before any rank could publish."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    schedule = AsyncCallsQueue.schedule_async_request

    def killed_after(queue, request):
        import torch

        index = schedule(queue, request)
        if torch.distributed.get_rank() == payload["kill_rank"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return index

    AsyncCallsQueue.schedule_async_request = killed_after
    session = _session(payload)
    _train(session, session.start_step + 1, {session.start_step + 1},
           Path(payload["checkpoint_dir"]))
    return {"survived": True}  # not reached


def resumed(payload: dict) -> dict:
    """Fresh processes: load the checkpoint named in the overrides, train up to `steps`."""
    session = _session(payload)
    start = session.start_step
    records = _train(session, payload["steps"])
    resumed_from = session.resumed_from and session.resumed_from.name
    _finish()
    return {"start": start, "resumed_from": resumed_from, "records": records}


def stop_points(payload: dict) -> dict:
    """Ten resumes in one launch: from each of `points` (saved by a continuous run in
    `checkpoint_dir`), a new session loads that step and trains `after` more steps."""
    root = Path(payload["checkpoint_dir"])
    runs = {}
    for point in payload["points"]:
        overrides = [*payload.get("overrides", []), f"checkpoint.load={root / f'step_{point:07d}'}"]
        session = _session({**payload, "overrides": overrides})
        end = min(point + payload["after"], payload["steps"])
        runs[str(point)] = {"start": session.start_step, "records": _train(session, end)}
        _finish()
    return runs


def die_during_save(payload: dict) -> dict:
    """Resume, train one step, and SIGKILL rank `kill_rank` as the save reaches `kill_at`
    (`module.function` of trainer/checkpoint/, patched where the save looks it up): the crash
    the next start must survive."""
    import importlib

    module_name, function = payload["kill_at"].rsplit(".", 1)
    module = importlib.import_module(f"trainer.checkpoint.{module_name}")
    target = getattr(module, function)

    def killed(*args, **kwargs):
        import torch

        if torch.distributed.get_rank() == payload["kill_rank"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return target(*args, **kwargs)

    setattr(module, function, killed)
    session = _session(payload)
    _train(session, session.start_step + 1, {session.start_step + 1},
           Path(payload["checkpoint_dir"]))
    return {"survived": True}  # not reached: the killed rank's peers are stopped with it


def save_with_planted_object(payload: dict) -> dict:
    """A checkpoint whose RNG object carries pickled code (as a tampered file would), then an
    attempt to load it: the restricted unpickler must refuse it without running it."""
    from trainer.checkpoint.load import UntrustedCheckpointError, load_checkpoint
    from trainer.checkpoint.save import save_checkpoint
    from trainer.state import RngState

    marker = Path(payload["marker"])
    session = _session(payload)
    _train(session, 1)
    original = RngState.as_dict
    RngState.as_dict = lambda self: {**original(self), "planted": _Planted(str(marker))}
    path = save_checkpoint(session, payload["checkpoint_dir"])
    RngState.as_dict = original
    try:
        load_checkpoint(session, path)
        refused = None
    except UntrustedCheckpointError as error:
        refused = str(error)
    _finish()
    return {"refused": refused, "ran_code": marker.exists()}


class _Planted:
    """Unpickling this runs `open(path, "w")`: the code a malicious checkpoint would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def random_points(seed: int, last: int, count: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(1, last), count))

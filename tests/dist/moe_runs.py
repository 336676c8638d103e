"""Per-rank functions for the MoE tests (run through the `launch_ranks` fixture).

Like `layout_runs.train_steps`, but each step goes through the plugin hooks as the trainer's loop
drives them (`run_start` once, `after_step` after every step), so the MoE plugin's figures come
back with the losses. Sessions are built by `layout_runs._session`, exactly as a run builds them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.dist.layout_runs import _finish, _session


def _moe_plugin(session):
    return next(plugin for plugin in session.plugins if plugin.name == "moe")


def _set_expert_bias(session, bias: list[float]) -> None:
    """Every router's aux-loss-free expert bias set to `bias` (one value per expert)."""
    import torch

    for chunk in session.model:
        for name, buffer in chunk.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(torch.tensor(bias, dtype=buffer.dtype))


def train_steps_with_figures(payload: dict) -> dict:
    """Per-step loss, grad norm, the plugin's figures and its per-layer token counts; with
    `expert_bias`, every router starts from that bias; with `weights_dir`, the initial weights
    are saved there first (the reference every other layout loads)."""
    from plugins.protocol.events import RunStart
    from tests.dist.reference_weights import save_model_weights
    from trainer.step import train_step

    session = _session(payload)
    weights = None
    if payload.get("weights_dir"):
        weights = str(save_model_weights(payload["weights_dir"], session.cfg, session.model))
    if payload.get("expert_bias"):
        _set_expert_bias(session, payload["expert_bias"])
    # Figures on every step (the plugin gathers them at the log interval).
    cfg = dataclasses.replace(session.cfg, logging=dataclasses.replace(session.cfg.logging,
                                                                       log_interval=1))
    session.plugins.run_start(RunStart(cfg, session.run_dir, 0, cfg.train.train_iters))
    trace: dict[str, list] = {"losses": [], "grad_norms": [], "extra": [], "per_layer": []}
    for _ in range(payload["steps"]):
        metrics = train_step(session)
        session.plugins.after_step(metrics)
        trace["losses"].append(metrics.loss)
        trace["grad_norms"].append(metrics.grad_norm)
        trace["extra"].append(metrics.extra)
        trace["per_layer"].append(_moe_plugin(session).last_per_layer)
    _finish()
    return {**trace, "weights": weights}


def pretrain_metrics(payload: dict) -> dict:
    """A whole run as `scripts/pretrain.py` does it on this rank (loop, reporter, summary);
    rank 0 returns the train records of metrics.jsonl and the step log lines it printed."""
    import json
    import os
    import sys

    import torch

    from recipes.resolve import resolve_config
    from tests.dist.layout_runs import TEST_DATA
    from trainer.checkpoint.preflight import validate_paths
    from trainer.entry.commands import pretrain_rank

    cfg = resolve_config([f"recipe={payload['recipe']}", *TEST_DATA, *payload["overrides"]])
    validate_paths(cfg)
    cfg.checkpoint.save = False
    cfg.logging.progress_bar = False
    run_dir = Path(payload["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    # The run's log lines are read back from this file.
    stdout_path = run_dir / f"rank{torch.distributed.get_rank()}.stdout"
    with stdout_path.open("w") as stdout:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(stdout.fileno(), 1)
        try:
            pretrain_rank(cfg, run_dir, None)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
    _finish()
    if torch.distributed.get_rank() != 0:
        return {}
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    log = stdout_path.read_text().splitlines()
    return {"records": [r for r in records if r["kind"] == "train"],
            "log": [line for line in log if line.startswith("step ")]}

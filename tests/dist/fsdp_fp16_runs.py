"""Per-rank function for the self-test of the step fix `fsdp_empty_shard_unscaling`
(`trainer/step_fixes.py`, through `launch_ranks`): one fp16 step under Megatron FSDP at DP2 with
the fix left out.

The step fixes are installed once per process, so they are applied here without this one before
the session (whose own call is then a no-op).
"""

from __future__ import annotations

from tests.dist.layout_runs import _finish, _session


def fp16_step_without_patch(payload: dict) -> dict:
    """What the first fp16 step raises without the patch (None: it trained)."""
    from trainer.step import train_step
    from trainer.step_fixes import FSDP_UNSCALING, apply_step_fixes

    apply_step_fixes(skip=frozenset({FSDP_UNSCALING}))
    session = _session(payload)
    try:
        train_step(session)
        error = None
    except AttributeError as raised:
        error = f"{type(raised).__name__}: {raised}"
    _finish()
    return {"error": error}

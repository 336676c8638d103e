"""The workarounds of Megatron Core that need a process group and the distributed optimizer, each
shown to be needed: with it the load (or the save) is right, without it
(`megatron_fixes.skipping`) the same call fails or leaves a different state.

One launch of `tiny_dp2_distopt` (fp32, two ranks): a run saved after two steps in both
optimizer formats, then each fix's load into a fresh session with and without the fix; and a
run with overlapped param gather saved right after a step, with and without gathering first.
The unit tier covers the fixes that need no model (tests/unit/test_megatron_fixes.py).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from tests.dist.layout_runs import _finish, _session

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.test_load_path_fixes"
RECIPE, RANKS = "tiny_dp2_distopt", 2
SAVED_AT = 2
OVERLAP = ["optimizer.overlap_grad_reduce=true", "optimizer.overlap_param_gather=true"]


def _attempt(action) -> str:
    """'ok', what `action` says went wrong, or the error it raised (one line)."""
    try:
        problem = action()
    except Exception as error:  # the outcome is the test's to judge
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    return problem or "ok"


def _inner_steps(optimizer) -> list[float]:
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return sorted({float(state["step"]) for part in inner
                   for state in part.optimizer.state.values()})


def _weights_digest(model) -> str:
    from megatron.core.utils import unwrap_model

    digest = hashlib.sha256()
    for chunk in unwrap_model(model):
        for parameter in chunk.parameters():
            digest.update(parameter.detach().float().numpy().tobytes())
    return digest.hexdigest()[:16]


def _load_outcome(payload: dict, path: Path, fix: str, skip: bool, overrides=()) -> str:
    """A fresh session loads `path` (with `fix` left out when `skip`); for the per-parameter
    step, one more step shows whether every parameter counts its steps alone."""
    from trainer.checkpoint import megatron_fixes
    from trainer.checkpoint.load import load_checkpoint
    from trainer.step import train_step

    session = _session({**payload, "overrides": list(overrides)})

    def load() -> str | None:
        with megatron_fixes.skipping({fix} if skip else set()):
            load_checkpoint(session, path)
        if fix != "give_each_param_its_own_step":
            return None
        train_step(session)
        steps = _inner_steps(session.optimizer)
        expected = [float(SAVED_AT + 1)]
        return None if steps == expected else (
            f"steps after one more step: {steps} (each parameter: {expected})")

    outcome = _attempt(load)
    _finish()
    return outcome


def _gather_outcome(payload: dict, root: Path, skip: bool) -> str:
    """Save right after a step with overlapped param gather; the saved weights must be the ones
    the step produced (gathered afterwards here, as the next forward would)."""
    from trainer.checkpoint import megatron_fixes
    from trainer.checkpoint.load import load_model_weights
    from trainer.checkpoint.save import save_checkpoint
    from trainer.step import train_step

    session = _session({**payload, "overrides": OVERLAP})
    for _ in range(SAVED_AT):  # the first step's warm-up lr is 0: the weights move from the 2nd
        train_step(session)
    with megatron_fixes.skipping({"params_gathered_before_save"} if skip else set()):
        saved = save_checkpoint(session, root / ("stale" if skip else "gathered"))
    for chunk in session.model:
        chunk.disable_forward_pre_hook(param_sync=True)
    trained = _weights_digest(session.model)
    load_model_weights(saved, session.model)
    outcome = "ok" if _weights_digest(session.model) == trained else (
        "the saved weights are not the ones the step produced")
    _finish()
    return outcome


def fix_outcomes(payload: dict) -> dict:
    """Per fix: {"with": outcome, "without": outcome}."""
    from trainer.checkpoint.save import save_checkpoint
    from trainer.step import train_step

    root = Path(payload["checkpoint_dir"])
    session = _session({**payload, "overrides": []})
    for _ in range(SAVED_AT):
        train_step(session)
    dp = save_checkpoint(session, root / "dp")
    session.cfg.checkpoint.optimizer_format = "fully_reshardable"
    fully = save_checkpoint(session, root / "fully")
    other_lr = f"optimizer.lr={session.cfg.optimizer.lr * 2}"
    _finish()
    loads = {
        "create_state_if_missing": (dp, ()),
        "keep_step_out_of_param_state": (fully, ()),
        "load_without_grad": (dp, ()),
        "give_each_param_its_own_step": (dp, ()),
        "adopt_hyperparameters": (dp, (other_lr,)),
    }
    outcomes = {fix: {case: _load_outcome(payload, path, fix, case == "without", overrides)
                      for case in ("with", "without")}
                for fix, (path, overrides) in loads.items()}
    outcomes["params_gathered_before_save"] = {
        case: _gather_outcome(payload, root, case == "without") for case in ("with", "without")}
    return outcomes


WITHOUT = {  # what each fix's absence does (docs/checkpoints.md, Megatron Core 0.19.2 defects)
    "create_state_if_missing": r"AssertionError",  # distrib_optimizer.py:839
    "keep_step_out_of_param_state": r"KeyError: 'step'",  # fully_reshardable, :1223
    "load_without_grad": r"RuntimeError: .*leaf Variable",  # dp_reshardable fp32, :1225
    "give_each_param_its_own_step": r"steps after one more step: \[(?!3\.0\])",  # :1028
    "adopt_hyperparameters": r"KeyError",  # param groups matched by max_lr, :941-970
    "params_gathered_before_save": r"the saved weights are not the ones the step produced",
}


@pytest.fixture(scope="module")
def outcomes(launch_ranks, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fixes")
    return launch_ranks(RANKS, f"{ENTRY}:fix_outcomes", {
        "recipe": RECIPE, "run_dir": str(root), "checkpoint_dir": str(root / "checkpoints")})[0]


@pytest.mark.parametrize("fix", list(WITHOUT))
def test_with_the_fix_the_checkpoint_round_trips(outcomes, fix):
    assert outcomes[fix]["with"] == "ok"


@pytest.mark.parametrize("fix", list(WITHOUT))
def test_without_the_fix_it_breaks(outcomes, fix):
    assert re.match(WITHOUT[fix], outcomes[fix]["without"]), outcomes[fix]["without"]


def test_every_fix_of_this_tier_is_checked():
    from tests.unit.test_megatron_fixes import DIST_CHECKED

    # The disk's fix is shown by tests/dist/test_full_disk.py, Megatron FSDP's by test_fsdp.py.
    assert set(WITHOUT) == DIST_CHECKED - {"disk_asked_after_a_failed_write",
                                           "empty_shard_optimizer_state",
                                           "swiglu_optimizer_keys"}

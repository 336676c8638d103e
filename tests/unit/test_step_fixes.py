"""Self-test of the step fix `recompute_without_te_fp8_state` (trainer/step_fixes.py): Megatron's
`CheckpointWithoutOutput()`, behind `layernorm` and `moe_act` recompute, asks Transformer
Engine's FP8 state even for fp8=False and stops with a NameError where TE is absent; with the
fix its forward runs. End to end the recompute trains the same losses (test_layout_equivalence,
test_moe_equivalence)."""

from __future__ import annotations

import pytest
import torch

from trainer.step_fixes import RECOMPUTE_WITHOUT_TE, install_recompute_without_te


def test_checkpoint_without_output_runs_without_te_only_with_the_fix(monkeypatch):
    from megatron.core.tensor_parallel import random

    if random.HAVE_TE:
        pytest.skip(f"Transformer Engine imports here: {RECOMPUTE_WITHOUT_TE} changes nothing")
    # Megatron's own __init__ comes back after the test (the fix replaces it on the class).
    monkeypatch.setattr(random.CheckpointWithoutOutput, "__init__",
                        random.CheckpointWithoutOutput.__init__)
    monkeypatch.setattr(random, "_get_all_rng_states", lambda: None)  # CUDA's, not this test's
    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    with pytest.raises(NameError, match="name 'FP8GlobalStateManager' is not defined"):
        random.CheckpointWithoutOutput().checkpoint(torch.relu, x)
    install_recompute_without_te()
    checkpoint = random.CheckpointWithoutOutput()
    assert checkpoint.fp8 is False
    assert torch.equal(checkpoint.checkpoint(torch.relu, x), torch.tensor([0.0, 2.0]))

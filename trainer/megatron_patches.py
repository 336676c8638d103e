"""Every change this project makes to Megatron's behaviour, in one table of named patches.

Megatron Core 0.19.2 (and, for the parity check, Megatron-LM's `megatron.training`) is used
unmodified: nothing under site-packages is edited. Where it cannot run here or does the wrong
thing, a patch changes it from the outside, at run time. Each has a name, what of Megatron it
works around (the symbol and file:line), why (one line) and the test that shows what breaks
without it; `registry()` collects them from their homes, where each is applied and can be left
out by name for its self-test:

- the CPU runtime (`trainer/cpu_runtime/runtime.py`, left out with
  `activate_cpu_runtime(skip=...)`): Megatron Core over gloo without CUDA;
- Megatron-LM on CPU (`trainer/cpu_runtime/megatron_lm.py`, `megatron_lm_on_cpu(skip=...)`):
  what the parity check and the checkpoint moves need to run Megatron-LM's own loop on CPU;
- the checkpoint paths (`trainer/checkpoint/megatron_fixes.py`, `skipping(...)`): defects and
  slow defaults of Megatron's save and load;
- the GPU fast paths (`trainer/gpu_fast_paths.py`, `wgrad_fusion_without_apex(skip=True)`):
  Transformer Engine's weight-gradient fusion without APEX;
- the training step on every device (`trainer/step_fixes.py`, `apply_step_fixes(skip=...)`):
  Megatron defects that stop a step on GPUs and CPUs alike.

`tests/unit/test_megatron_patches.py` holds the table to its homes and to its self-tests; the
stories behind each are in docs/cpu-runtime.md and docs/checkpoints.md.
"""

from __future__ import annotations

from trainer.checkpoint.megatron_fixes import FIXES
from trainer.cpu_runtime.megatron_lm import MEGATRON_LM_PATCHES
from trainer.cpu_runtime.runtime import CPU_RUNTIME_PATCHES
from trainer.gpu_fast_paths import GPU_PATCHES
from trainer.patch import Patch
from trainer.step_fixes import STEP_PATCHES


def registry() -> dict[str, Patch]:
    """Every patch by name, from each of its homes (a name is one patch in the whole table)."""
    found: dict[str, Patch] = {}
    for patch in (*CPU_RUNTIME_PATCHES, *MEGATRON_LM_PATCHES,
                  *(fix.patch for fix in FIXES.values()), *GPU_PATCHES, *STEP_PATCHES):
        if patch.name in found:
            raise ValueError(f"two patches are named {patch.name}")
        found[patch.name] = patch
    return found

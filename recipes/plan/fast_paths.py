"""The plan's line of GPU fast paths: which are on, and what each saves or costs in memory on the
worst rank, from the planner's own terms (`recipes/plan/activations.py`: selective recompute by
module and activation offloading take activations off, CUDA graphs add their static buffers;
low-precision GEMM weights are priced in the model state). On CPU ranks the line also says what
runs without them there (`recipes/config/fast_paths.off_on_cpu`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from recipes.config.fast_paths import fast_paths_on, off_on_cpu
from recipes.plan.activations import fused_norms, stage_activations
from recipes.plan.fit import size_text


def _activations(cfg: Any, attention: str, stage: int, te_layers: bool, **train: Any) -> float:
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))
    return stage_activations(changed, attention, te_layers)[stage].total


def memory_effects(cfg: Any, attention: str, stage: int, te_layers: bool) -> dict[str, float]:
    """Bytes each fast path changes on one rank of `stage` (negative: saved): selective
    recompute against none, offloading against keeping its inputs, CUDA graphs' buffers;
    `te_layers`: on Transformer Engine's layers (`activations.fused_norms`)."""
    t, found = cfg.train, {}
    now = stage_activations(cfg, attention, te_layers)[stage]
    if t.recompute == "selective":
        found["recompute"] = now.total - _activations(cfg, attention, stage, te_layers,
                                                      recompute="none")
    if t.offload_modules:
        found["offload"] = now.total - _activations(cfg, attention, stage, te_layers,
                                                    offload_modules=[])
    if t.cuda_graphs != "none":
        found["graphs"] = now.cuda_graphs
    return found


def _effect(name: str, effects: dict[str, float]) -> str:
    key = ("recompute" if name.startswith("selective recompute") else
           "offload" if name.startswith("activation offloading") else
           "graphs" if name.startswith("CUDA graphs") else None)
    if key is None or key not in effects:
        return name
    value = effects[key]
    verb = {"recompute": "saves", "offload": "moves to host", "graphs": "costs"}[key]
    return f"{name} {verb} {size_text(abs(value))}"


def fast_path_line(cfg: Any, attention: str, stage: int, on_gpu: bool) -> str:
    """One line: the fast paths on, with their memory on the worst rank (`stage`), and on CPU
    ranks those left off there."""
    effects = memory_effects(cfg, attention, stage, fused_norms(cfg, on_gpu))
    names = [_effect(name, effects) for name in fast_paths_on(cfg)]
    stored = cfg.plugins.gemm_weights(cfg)
    if stored is not None:
        names.append(f"GEMM weights in {stored.bytes_per_weight} byte(s), gathered over DP so "
                     "(in the model state)")
    line = "fast paths: " + ("; ".join(names) if names else "none beyond the fusions")
    off = off_on_cpu(cfg, on_gpu)
    if off:
        line += f" (off on CPU ranks: {', '.join(off)})"
    return line

"""The closed set of points where plugins attach to the trainer.

A plugin is a typed config plus a function that adds callables to these lists; the trainer
calls each list at one fixed place. New features (FP8, context parallel, packing, MoE,
logging backends, profiling) attach here instead of editing the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Point -> where the trainer calls it:
#   transformer_config(cfg, tc) -> tc   after translation, before the model is built
#   layer_spec(cfg, spec, tc) -> spec   when the layer spec is chosen (module swaps)
#   microbatch(batch) -> batch          on every micro-batch before the forward pass
#   after_step(metrics) -> None         after every optimizer step (rank 0 and others)
#   run_end(summary) -> None            once, after training and the final checkpoint


@dataclass
class TrainerHooks:
    transformer_config: list[Callable[[Any, Any], Any]] = field(default_factory=list)
    layer_spec: list[Callable[[Any, Any, Any], Any]] = field(default_factory=list)
    microbatch: list[Callable[[dict], dict]] = field(default_factory=list)
    after_step: list[Callable[[Any], None]] = field(default_factory=list)
    run_end: list[Callable[[Any], None]] = field(default_factory=list)

    def apply_transformer_config(self, cfg, tc):
        for fn in self.transformer_config:
            tc = fn(cfg, tc)
        return tc

    def apply_layer_spec(self, cfg, spec, tc):
        for fn in self.layer_spec:
            spec = fn(cfg, spec, tc)
        return spec

    def apply_microbatch(self, batch: dict) -> dict:
        for fn in self.microbatch:
            batch = fn(batch)
        return batch

    def notify_after_step(self, metrics) -> None:
        for fn in self.after_step:
            fn(metrics)

    def notify_run_end(self, summary) -> None:
        for fn in self.run_end:
            fn(summary)

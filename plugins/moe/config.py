"""Config of the MoE plugin (torch-free): which router figures an MoE model reports.

A plugin rather than trainer code: only MoE models have routers, the figures need hooks into
Megatron Core's router (its metrics tracker records the load-balancing loss but nothing reports
it, and it does not count tokens per expert at all), and the trainer stays free of MoE names.

It is on exactly when the model has experts (`model.num_moe_experts`), with no switch: these
figures are the only sign of a collapsing router (a few experts taking the tokens), which
otherwise trains on silently, and Megatron-LM reports the load-balancing loss of every run with
experts too (`training/training.py:2759`, `if args.num_experts is not None`). Their cost is a
few small all-reduces per logged step (a layers x experts count, Megatron's reduction of its
tracked losses), nothing on the steps between. `per_expert` stays a choice:
it adds one figure per expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol.hooks import Plugin, PluginConfig


@dataclass(kw_only=True)
class MoeConfig(PluginConfig):
    """Router figures of an MoE model at the log interval: load-balancing loss, tokens per
    expert and their imbalance (max / mean). On for every model with experts; a dense model has no
    routers, and the plugin is not built."""

    per_expert: bool = True  # also each expert's token count (one figure per expert)

    def retired_keys(self) -> dict[str, str]:
        return {"enabled": "removed: the router figures follow model.num_moe_experts (on for "
                           "every model with experts); delete the key (plugins.moe.per_expert="
                           "false leaves out the per-expert figures)"}

    def active(self, cfg: Any) -> bool:
        return bool(cfg.model.num_moe_experts)

    def build(self) -> Plugin | None:
        from plugins.moe.plugin import MoePlugin

        return MoePlugin(self)

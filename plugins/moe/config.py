"""Config of the MoE plugin (torch-free): whether router figures are reported, and which.

A plugin rather than trainer code: only MoE models have routers, the figures need hooks into
Megatron Core's router (its metrics tracker records the load-balancing loss but nothing reports
it, and it does not count tokens per expert at all), and the trainer stays free of MoE names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugins.protocol.hooks import Plugin, PluginConfig


@dataclass(kw_only=True)
class MoeConfig(PluginConfig):
    """Router figures of an MoE model after every step: load-balancing loss, tokens per expert
    and their imbalance (max / mean). A dense model has no routers: nothing is reported."""

    enabled: bool = False  # report the router figures each step (the MoE recipes turn it on)
    per_expert: bool = True  # also each expert's token count (one figure per expert)

    def active(self, cfg: Any) -> bool:
        return self.enabled

    def build(self) -> Plugin | None:
        from plugins.moe.plugin import MoePlugin

        return MoePlugin(self)

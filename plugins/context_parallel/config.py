"""Config of the context-parallel plugin (torch-free): how CP ranks exchange keys and values.

The CP size itself is a layout degree (`parallel.context`, owned by `recipes/config/layout.py`),
and the plugin is on exactly when it is above 1 (no switch of its own to keep in step with it);
this plugin owns what CP needs beyond the degree: the batch split per CP rank (Megatron Core's
load-balanced chunks) and Transformer Engine's communication scheme (`cp_comm_type`,
`core/transformer/transformer_config.py`, passed to TE's attention by
`core/extensions/transformer_engine.py`), under the names Megatron Core and TE accept (listed
at `cp_comm_type` in `core/transformer/transformer_config.py:987-1000`; Megatron-LM's
`--cp-comm-type` help says `allgather`, which TE refuses). The schemes: `p2p` passes K/V
around a ring, overlapped with compute; `all_gather` gathers all K/V first; `a2a` (Ulysses)
swaps the sequence split for a head split, so each CP rank needs whole heads; `a2a+p2p` does
a2a inside groups and p2p between them, with the group sizes in `hierarchical_sizes`: its
groups are created with the other process groups (`process_group_options`), and the plugin
refuses to run without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from plugins.protocol.hooks import Plugin, PluginConfig, Rule


def check_cp_hierarchical_sizes(cfg: Any) -> str | None:
    """a2a+p2p needs the two levels' sizes, [a2a, p2p], each at least 1, whose product is the
    CP size: "groups of two levels", a2a's then p2p's (model_parallel_config.py:103-108); a
    negative pair whose product is the CP size would pass the product alone. Others take none."""
    cp_cfg, cp = cfg.plugins.context_parallel, cfg.parallel.context
    sizes = cp_cfg.hierarchical_sizes
    if cp_cfg.comm_type == "a2a+p2p":
        if not sizes or len(sizes) != 2 or min(sizes) < 1 or math.prod(sizes) != cp:
            return (
                f"plugins.context_parallel.comm_type=a2a+p2p needs "
                f"plugins.context_parallel.hierarchical_sizes [a2a size, p2p size], each at "
                f"least 1, whose product is parallel.context={cp}, got {sizes}; set e.g. "
                f"plugins.context_parallel.hierarchical_sizes="
                f"[{2 if cp % 2 == 0 else cp},{cp // 2 if cp % 2 == 0 else 1}]"
            )
    elif sizes is not None:
        return (
            f"plugins.context_parallel.hierarchical_sizes={sizes} is only used with "
            f"comm_type=a2a+p2p, got comm_type={cp_cfg.comm_type}; remove it"
        )
    return None


def check_cp_a2a_heads(cfg: Any) -> str | None:
    """a2a splits each TP rank's attention heads (and KV groups) over CP: they must divide."""
    cp_cfg, m, p = cfg.plugins.context_parallel, cfg.model, cfg.parallel
    if cp_cfg.comm_type not in ("a2a", "a2a+p2p") or p.context == 1:
        return None
    a2a_size = p.context if cp_cfg.comm_type == "a2a" else (cp_cfg.hierarchical_sizes or [1])[0]
    groups = m.num_query_groups or m.num_attention_heads
    for name, heads in (("model.num_attention_heads", m.num_attention_heads),
                        ("model.num_query_groups", groups)):
        if (heads // p.tensor) % a2a_size:
            return (
                f"plugins.context_parallel.comm_type={cp_cfg.comm_type} splits heads over "
                f"{a2a_size} CP ranks, but {name}={heads} / TP{p.tensor} does not divide by it; "
                "use comm_type=p2p or change the heads"
            )
    return None


@dataclass(kw_only=True)
class ContextParallelConfig(PluginConfig):
    """Context parallelism: load-balanced sequence chunks per CP rank and the K/V exchange."""

    comm_type: Literal["p2p", "a2a", "all_gather", "a2a+p2p"] = "p2p"  # TE's cp_comm_type
    hierarchical_sizes: list[int] | None = None  # a2a+p2p: [a2a size, p2p size], product = CP

    def rules(self) -> tuple[Rule, ...]:
        return (check_cp_hierarchical_sizes, check_cp_a2a_heads)

    def process_group_options(self, cfg: Any) -> dict[str, Any]:
        """a2a+p2p runs in Megatron's hierarchical CP groups, created with the other groups."""
        if self.comm_type != "a2a+p2p" or cfg.parallel.context == 1:
            return {}
        return {"hierarchical_context_parallel_sizes": list(self.hierarchical_sizes or [])}

    def active(self, cfg: Any) -> bool:
        return cfg.parallel.context > 1

    def build(self) -> Plugin | None:
        from plugins.context_parallel.plugin import ContextParallelPlugin

        return ContextParallelPlugin(self)

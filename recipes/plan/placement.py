"""Placement: every process group as node:GPU, a nodes x GPUs drawing, and which groups cross
the node boundary (their traffic leaves the node's fast links).

Everything comes from the layout object (`recipes/config/layout.py`), which reproduces
Megatron Core's own rank order; nothing here recomputes it. Ranks fill node 0's GPUs first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Group kinds the planner reports, in the order a reader meets them.
PLAN_GROUPS = ("tp", "cp", "dp", "dp-cp", "pp", "ep", "expert-tp", "expert-dp")
DRAWN_NODES = 8  # the drawing shows this many nodes, then a count of the rest


@dataclass(frozen=True)
class GroupSummary:
    kind: str
    size: int
    count: int
    crossing: int  # groups whose ranks sit on more than one node
    groups: list[str]  # each group as 'N0:G0-G7 ...'


def group_summaries(layout: Any, listed: int | None = None,
                    moe: bool = False) -> list[GroupSummary]:
    """Every group kind in use (size > 1; expert groups only for MoE models, DP x CP only with
    CP); `listed` caps how many groups of each kind are written out."""
    result = []
    for kind in PLAN_GROUPS:
        expert = kind in ("ep", "expert-tp", "expert-dp")
        if (expert and not moe) or (kind == "dp-cp" and layout.context == 1):
            continue
        groups = layout.groups(kind)
        if not groups or len(groups[0]) == 1:
            continue
        gpn = layout.gpus_per_node
        crossing = sum(1 for g in groups if len({rank // gpn for rank in g}) > 1)
        shown = groups if listed is None else groups[:listed]
        result.append(GroupSummary(kind, len(groups[0]), len(groups), crossing,
                                   [layout.placement(g) for g in shown]))
    return result


def rank_label(layout: Any, rank: int) -> str:
    """'p0t3d1' (+'c1' with CP): pipeline stage, TP rank, DP replica of a rank."""
    c = layout.coordinates(rank)
    cp = f"c{c.cp}" if layout.context > 1 else ""
    return f"p{c.pp}t{c.tp}{cp}d{c.dp}"


def drawing(layout: Any, nodes: int = DRAWN_NODES) -> list[str]:
    """One line per node: each GPU's stage, TP rank (CP rank) and DP replica."""
    gpn = layout.gpus_per_node
    lines = []
    for node in range(min(nodes, layout.nodes)):
        cells = [rank_label(layout, node * gpn + gpu) for gpu in range(gpn)]
        lines.append(f"N{node}: " + " ".join(cells))
    if layout.nodes > nodes:
        lines.append(f"... {layout.nodes - nodes:,} more nodes in the same pattern")
    return lines

"""TP and CP groups that span nodes: allowed, but said out loud before anything runs.

Tensor parallelism exchanges activations inside every layer, forward and backward, and context
parallelism passes K/V round its ring in every attention layer; both are meant for the links
inside a node. A layout whose TP (or CP) groups reach across nodes runs, but that traffic then
crosses the inter-node network, usually an order of magnitude slower, on the critical path of
every layer. The warning names the group, how many nodes it spans, what it sends per step and
how long that takes at the two bandwidths, and the layout that keeps it inside a node. It is
printed by the planner, the dry run, the launch and the pre-flight of a run.
"""

from __future__ import annotations

from typing import Any

from recipes.plan.comm import Traffic

GB = 1e9

KINDS = ("tp", "cp")


def _nodes_spanned(layout: Any, kind: str) -> int:
    group = layout.groups(kind)[0]
    return len({rank // layout.gpus_per_node for rank in group})


def _duration(seconds: float) -> str:
    return f"{seconds:,.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _fix(kind: str, layout: Any) -> str:
    gpus = layout.gpus_per_node
    if kind == "tp":
        return (f"keep parallel.tensor <= {gpus} (the GPUs of a node) and span nodes with "
                "parallel.pipeline or data parallelism")
    return (f"keep parallel.tensor x parallel.context <= {gpus} (the GPUs of a node), or accept "
            "the cost where the sequence needs it")


def spanning_warning(layout: Any, cluster: Any, busiest: Traffic) -> str:
    """The one line for one group kind, from its busiest stage's traffic."""
    name = busiest.group.upper()
    size = layout.tensor if busiest.group == "tp" else layout.context
    inside = busiest.bytes_sent / (cluster.intra_node_gb_per_s * GB)
    nodes = _nodes_spanned(layout, busiest.group)
    return (f"warning: each {name} group ({size} ranks) spans {nodes} nodes of "
            f"{layout.gpus_per_node} GPUs, so its {busiest.operation} "
            f"({busiest.bytes_sent / GB:.3g} GB per rank per step) crosses the inter-node "
            f"network: {cluster.inter_node_gb_per_s:g} GB/s per GPU instead of "
            f"{cluster.intra_node_gb_per_s:g} GB/s inside a node, {_duration(busiest.seconds)} "
            f"per step instead of {_duration(inside)}; {_fix(busiest.group, layout)}")


def spanning_warnings(cfg: Any, cluster: Any, stage_traffic: list[list[Traffic]]) -> list[str]:
    """One warning per kind (TP, then CP) whose groups cross nodes, from every stage's traffic."""
    found = []
    for kind in KINDS:
        crossing = [t for stage in stage_traffic for t in stage
                    if t.group == kind and t.inter_node]
        if crossing:
            busiest = max(crossing, key=lambda t: t.bytes_sent)
            found.append(spanning_warning(cfg.layout, cluster, busiest))
    return found

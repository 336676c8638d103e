"""A layout search as text for people and as JSON for tools: the top layouts with their
step-time breakdown, what each lost to the best by, and the best of those that lost (too big
for the GPU, or refused by a validation rule), then the command that trains the winner.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from recipes.config.arguments import with_replaced
from recipes.config.megatron_args import MEGATRON_ARGS_NAME, torchrun_line
from recipes.plan.search import NEAR_MISS, Evaluated, SearchResult, apply_candidate, refusal

TERMS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp", "cores")
LOSERS_SHOWN = 3


def lost_by(e: Evaluated, best: Evaluated) -> str:
    """The term that costs this layout most against the best one, e.g. 'bubble +0.07 s'."""
    if e is best or not e.time or not best.time:
        return ""
    mine, theirs = e.time.items(), best.time.items()
    term = max(TERMS, key=lambda k: mine[k] - theirs[k])
    return f"{term} {mine[term] - theirs[term]:+.3g} s"


def near_misses(cfg: Any, r: SearchResult, cluster: Any) -> list[Evaluated]:
    """The fastest layouts that do not fit, among those within a quarter of the GPU's memory
    (all of them when none is that close), leaving out any a validation rule refuses."""
    close = [e for e in r.too_big if e.peak <= NEAR_MISS * cluster.gpu_memory_bytes]
    trainable = (e for e in close or r.too_big if refusal(cfg, e.candidate) is None)
    return list(itertools.islice(trainable, LOSERS_SHOWN))


def shown_terms(cluster: Any) -> tuple[str, ...]:
    """The breakdown's columns: `cores` (the host-cores bound's excess) only for a cluster file
    whose ranks share a node's CPU cores."""
    return TERMS if getattr(cluster, "host_cores", None) else TERMS[:-1]


def cores_note(cluster: Any, r: SearchResult) -> list[str]:
    """A line naming the host-cores bound when it sets some listed layout's step."""
    if not any(e.time and e.time.cores > 0 for e in r.listed):
        return []
    return [f"  cores: the host-cores bound binds ({r.gpus_per_node} ranks on "
            f"{cluster.host_cores} cores per node): step = the node's ranks' compute / "
            f"{cluster.host_cores} + exposed communication; the column is its excess over the "
            "per-rank sum"]


def offload_note(r: SearchResult) -> list[str]:
    """A line for listed layouts that offload the optimizer state: ranked after every one that
    fits without it, their modeled step leaves out the CPU's Adam step and the host copies."""
    if not any(e.candidate.offload for e in r.listed):
        return []
    return ["  distopt+offload: fits only with the optimizer state in CPU memory; ranked after "
            "every layout that fits without it, its modeled step leaves out the CPU's Adam "
            "step and the gradient and weight copies to and from the host"]


def _row(rank: int, e: Evaluated, best: Evaluated, terms_shown: tuple[str, ...]) -> str:
    t = e.time.items()
    terms = " ".join(f"{t[k]:>7.3f}" for k in terms_shown)
    return (f"{rank:>4} {e.seconds:>8.3f} {e.peak / 1e9:>7.1f}  {e.candidate.describe():<44} "
            f"{terms}  {lost_by(e, best)}")


def _head(cfg: Any, cluster: Any, r: SearchResult) -> list[str]:
    m = cfg.model
    return [f"search for {cfg.name}: {r.world:,} GPUs ({r.world // r.gpus_per_node:,} x "
            f"{r.gpus_per_node}, {cluster.name}, {cluster.gpu_memory_gb:g} GB), global batch "
            f"{cfg.train.global_batch_size} x {m.seq_length}, {cfg.precision.dtype}",
            f"  {r.enumerated:,} layouts: {r.enumerated - r.skipped:,} planned for memory, "
            f"{r.timed:,} of them timed ({r.skipped:,} less sharded twins of one too big by "
            f"over {NEAR_MISS - 1:.0%} and {r.dominated:,} SP-off and DDP twins counted, not "
            f"planned; {r.pruned_blocks:,} TP/PP/CP/EP blocks skipped whole: their smallest "
            f"variant does not fit), {len(r.fitting):,} fit"
            + (f" ({r.refused:,} more that a validation rule refuses, not ranked)"
               if r.refused else "") + f", searched in {r.seconds:.1f} s",
            "  modeled step time, seconds (compute at GEMM-shape efficiency; exposed "
            "communication; bubble):"]


def train_command(cfg: Any, given: Sequence[str], best: Evaluated) -> str:
    """The pretrain command of the best layout: the user's own command line (recipe or saved
    config, and every override) with the layout's settings in place of any it gave; for a
    config read from a Megatron-LM line (`megatron_args=`), which names no recipe, the
    torchrun line of that layout."""
    if cfg.name == MEGATRON_ARGS_NAME:
        return torchrun_line(apply_candidate(cfg, best.candidate))
    words = with_replaced(given, best.candidate.overrides())
    if not any(word.startswith(("recipe=", "config=")) for word in words):
        words.insert(0, f"recipe={cfg.name}")
    return "python scripts/pretrain.py " + " ".join(words)


def text_search(cfg: Any, cluster: Any, r: SearchResult, given: Sequence[str] = ()) -> str:
    lines = _head(cfg, cluster, r) + cores_note(cluster, r) + offload_note(r)
    terms_shown = shown_terms(cluster)
    header = " ".join(f"{k:>7}" for k in terms_shown)
    lines.append(f"rank   step s peak GB  {'layout':<44} {header}  lost to #1 by")
    best = r.listed[0] if r.listed else None
    lines += [_row(i + 1, e, best, terms_shown) for i, e in enumerate(r.listed)]
    lines.append("best of what lost:")
    for e in near_misses(cfg, r, cluster):
        lines.append(f"  {e.candidate.describe():<44} {e.seconds:>8.3f} s modeled, but peak "
                     f"{e.peak / 1e9:.1f} GB > {cluster.gpu_memory_gb:g} GB")
    for e in r.invalid[:LOSERS_SHOWN]:
        lines.append(f"  {e.candidate.describe():<44} {e.seconds:>8.3f} s modeled, refused: "
                     f"{e.invalid}")
    if not r.too_big and not r.invalid:
        lines.append("  (nothing: every planned layout fits and passes validation)")
    if best:
        lines.append(f"train the best: {train_command(cfg, given, best)}")
    return "\n".join(lines)


def _evaluated_json(e: Evaluated) -> dict[str, Any]:
    return {"layout": e.candidate.describe(), "candidate": dataclasses.asdict(e.candidate),
            "overrides": e.candidate.overrides(), "peak_bytes": e.peak, "fits": e.fits,
            "step_seconds": e.seconds if e.time else None,
            "breakdown": e.time.items() if e.time else None, "refused": e.invalid}


def json_search(cfg: Any, cluster: Any, r: SearchResult,
                given: Sequence[str] = ()) -> dict[str, Any]:
    best = r.listed[0] if r.listed else None
    return {"recipe": cfg.name,
            "train_command": train_command(cfg, given, best) if best else None,
            "world_size": r.world, "gpus_per_node": r.gpus_per_node,
            "cluster": cluster.name, "layouts": r.enumerated,
            "planned": r.enumerated - r.skipped, "timed": r.timed, "skipped": r.skipped,
            "pruned_blocks": r.pruned_blocks,
            "dominated": r.dominated, "fitting": len(r.fitting),
            "fitting_refused": r.refused, "seconds": r.seconds,
            "top": [{**_evaluated_json(e), "lost_by": lost_by(e, best)} for e in r.listed],
            "too_big": [_evaluated_json(e) for e in near_misses(cfg, r, cluster)],
            "refused": [_evaluated_json(e) for e in r.invalid[:LOSERS_SHOWN]]}

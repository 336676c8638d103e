"""A plan as text for people and as JSON for tools (the same figures, bytes exact in JSON).

The text answers, in order: does it fit (and what fills the worst rank, what would fix it),
what each stage holds, where ranks sit and which groups cross nodes, what each rank sends per
step, how big the bubble is, and what the batch is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from recipes.plan.build import Plan, StagePlan
from recipes.plan.fit import (
    logits_note,
    refusal,
    size_text,
    suggestions,
    summary_line,
)

MIB = 2**20
SIZE_WIDTH = 10  # the widest size_text short of 1,000 PB: '999.99 GB', '866.35 kB', '3.20 PB'


def duration_text(seconds: float) -> str:
    """A step time: '12.34 s' as before for a real model; below 10 ms in ms with three
    significant digits ('0.0467 ms'), so a tiny recipe's step does not read '0.00 s'."""
    if seconds >= 0.01 or seconds == 0:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1e3:.3g} ms"


def hours_text(hours: float) -> str:
    """GPU-hours: whole hours from 100 up ('563,464', as the docs show), three significant
    digits below ('1.23', '0.0456'), and '<0.01' for less (a few tokens of a tiny model),
    never '0' for work that takes time; from 10**12 on '1.53e+19' (no made-up digits)."""
    if hours >= 1e12:  # beyond a float's digits that mean anything here
        return f"{hours:.3g}"
    if hours >= 100:
        return f"{hours:,.0f}"
    return f"{hours:.3g}" if hours >= 0.01 else "<0.01"


def plural(count: int, word: str) -> str:
    """'1 step', '2 steps', '1,000 steps'."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def cell_text(value: float) -> str:
    """A table's size: `size_text`, except nothing held reads '0' (not '0.00 kB')."""
    return size_text(value) if value else "0"


def _stage_rows(plan: Plan) -> list[str]:
    """One row per stage, every size through `size_text` (the one formatter, with its unit) so
    a tiny recipe's '4.61 MB' and a large one's '51.23 GB' line up in the same columns."""
    names = ("weights", "grads", "master", "Adam", "activ.", "peak")
    rows = [f"{'stage':>5}  {'layers':<10}  {'params/rank':>13}  "
            + "".join(f"{n:>{SIZE_WIDTH}}  " for n in names) + "(in flight)"]
    for s in plan.stages:
        st, a = s.state, s.activations
        layers = "+".join(str(n) for n in s.layers)
        sizes = (st.weights, st.grads, st.master, st.moments, a.total, s.peak)
        rows.append(f"{s.stage:>5}  {layers:<10}  {s.params.total:>13,}  "
                    + "".join(f"{cell_text(v):>{SIZE_WIDTH}}  " for v in sizes)
                    + f"({a.in_flight:g})")
    return rows


def _fit_lines(plan: Plan) -> list[str]:
    w = plan.worst
    verdict = "fits" if plan.fits else "does NOT fit"
    lines = [f"worst rank: stage {w.stage}, peak {size_text(w.peak)} of "
             f"{size_text(plan.cluster.gpu_memory_bytes)}: {verdict}", "  largest contributors:"]
    lines += [f"    {name:<48} {size_text(size):>{SIZE_WIDTH + 1}}{logits_note(plan, name)}"
              for name, size in w.contributors()[:5]]
    if w.state.offloaded:
        lines.append(f"  optimizer state offloaded to CPU: {size_text(w.state.offloaded)}")
    lines.append(_save_line(plan))
    if not plan.fits:
        lines.append("  suggestions (each alone, validated and re-planned):")
        lines += [f"    {s.change:<58} peak {size_text(s.peak)}{'  fits' if s.fits else ''}"
                  for s in suggestions(plan)]
    return lines


def _save_line(plan: Plan) -> str:
    """CPU memory while a checkpoint is written, per rank and per node, against the node's."""
    host = plan.cluster.host_memory_gb
    per_rank = max(s.save_host for s in plan.stages)
    against = (f" of {host:.0f} GB: {'fits' if plan.save_fits_host else 'does NOT fit'}"
               if host else " (no host_memory_gb in the cluster file)")
    fmt = ("Megatron FSDP's fsdp_dtensor" if plan.sharding not in ("none", "dist_opt") else
           f"checkpoint.optimizer_format={plan.cfg.checkpoint.optimizer_format}")
    return (f"checkpoint save: {size_text(per_rank)} of CPU memory per rank ({fmt}), "
            f"{size_text(plan.save_host_per_node)} per node{against}")


def _traffic_lines(stage: StagePlan) -> list[str]:
    """What one rank of the stage sends per step; a rank in no group of two or more (one GPU)
    says so on the header's line rather than leaving the header with nothing under it."""
    header = f"communication per optimizer step, one rank of stage {stage.stage}:"
    if not stage.traffic:
        return [f"{header} none (it shares no group with another rank)"]
    lines = [header]
    for t in stage.traffic:
        where = "inter-node" if t.inter_node else "intra-node"
        lines.append(f"  {t.group:<10} {t.operation:<34} {size_text(t.bytes_sent):>{SIZE_WIDTH}}"
                     f"  {where:<10} {milliseconds_text(t.seconds):>9} ms")
    return lines


def milliseconds_text(seconds: float) -> str:
    """A collective's time in ms: one decimal as before ('12.3'), two significant digits below
    0.1 ms ('0.042'), so a tiny message does not read '0.0'."""
    ms = seconds * 1e3
    return f"{ms:,.1f}" if ms >= 0.1 or ms == 0 else f"{ms:.2g}"


def _shorten(text: str, width: int = 92) -> str:
    """A long group ('N0:G0 N1:G0 ... N127:G0') cut to its first places and a count."""
    if len(text) <= width:
        return text
    places = text.split()
    head = text[:width].rsplit(" ", 1)[0]
    return f"{head} ... ({len(places)} nodes; --json lists all)"


def _placement_lines(plan: Plan) -> list[str]:
    lines = ["placement (pN tN dN = pipeline stage, TP rank, DP replica):"]
    lines += ["  " + line for line in plan.drawing]
    for g in plan.groups:
        cross = f"{g.crossing:,} cross nodes" if g.crossing else "all inside a node"
        lines.append(f"  {g.kind:<9} {g.count:>6,} groups of {g.size:<5} {cross}")
        for text in g.groups[:4]:
            lines.append(f"      {_shorten(text)}")
        if g.count > 4 and g.groups:
            lines.append(f"      ... {g.count - 4:,} more (--json lists all)")
    return lines


def _schedule_lines(plan: Plan) -> list[str]:
    b1, bi, b = plan.bubble_1f1b, plan.bubble_interleaved, plan.batch
    lines = [f"bubble: 1F1B {b1.fraction_of_step:.1%} of the step ({b1.slots} idle of "
             f"{b1.slots + b1.work_slots} slots)"]
    if bi:
        lines[0] += f"; interleaved {bi.fraction_of_step:.1%}"
    flight = plan.in_flight
    lines.append(f"micro-batches in flight on stage 0: all-forward {flight['all_forward']}, "
                 f"1F1B {flight['one_f_one_b']}")
    lines.append(f"batch: {b.micro_batch} x DP{b.data_parallel} x {b.accumulation} accumulation ="
                 f" {b.global_batch} sequences, {b.tokens_per_step:,} tokens per step")
    if b.ramp:
        stages = " -> ".join(f"{batch} from sample {threshold:,}" for threshold, batch in b.ramp)
        lines.append(f"  ramp-up: {stages}; full batch after {b.ramp_steps:,} steps "
                     f"({b.ramp_samples:,} samples)")
    if b.step_seconds:
        lines.append(f"  compute-bound step at {b.mfu:.0%} MFU: {duration_text(b.step_seconds)}")
    if b.steps:
        hours = f", {hours_text(b.gpu_hours)} GPU-hours" if b.gpu_hours else ""
        lines.append(f"  {plural(b.token_budget, 'token')}: {plural(b.steps, 'step')}{hours}")
    return lines


def text_report(plan: Plan) -> str:
    cfg, c = plan.cfg, plan.cluster
    head = [f"plan for {cfg.name}: {cfg.layout.describe(show_sequence_parallel=True)} on "
            f"{cfg.layout.nodes:,} x {cfg.layout.gpus_per_node} ({c.name}), "
            f"{plan.parameters:,} parameters, {cfg.precision.dtype}, sharding {plan.sharding}, "
            f"{plan.attention} attention, recompute {cfg.train.recompute}"]
    from recipes.plan.fast_paths import fast_path_line

    fast = [fast_path_line(cfg, plan.attention, plan.worst.stage, on_gpu=c.device != "cpu")]
    parts = [head, plan.warnings, plan.notes, fast, _fit_lines(plan), _stage_rows(plan),
             _placement_lines(plan), _traffic_lines(plan.worst), _schedule_lines(plan),
             [summary_line(plan)]]
    return "\n".join(line for part in parts for line in part)


def _stage_json(s: StagePlan) -> dict[str, Any]:
    return {
        "stage": s.stage, "layers": s.layers,
        "params": {**dataclasses.asdict(s.params), "total": s.params.total},
        "model_state_bytes": {**dataclasses.asdict(s.state), "total": s.state.total},
        "activation_bytes": {**dataclasses.asdict(s.activations), "total": s.activations.total},
        "peak_bytes": s.peak, "save_host_bytes": s.save_host,
        "contributors": [{"name": k, "bytes": v} for k, v in s.contributors()],
        "traffic": [dataclasses.asdict(t) for t in s.traffic],
    }


def json_report(plan: Plan) -> dict[str, Any]:
    layout = plan.cfg.layout
    return {
        "recipe": plan.cfg.name, "layout": layout.describe(), "world_size": layout.world_size,
        "nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node,
        "cluster": dataclasses.asdict(plan.cluster), "parameters": plan.parameters,
        "sharding": plan.sharding, "attention": plan.attention,
        "fits": plan.fits, "worst_stage": plan.worst.stage, "peak_bytes": plan.worst.peak,
        "save_host_bytes_per_node": plan.save_host_per_node, "save_fits_host": plan.save_fits_host,
        "suggestions": [dataclasses.asdict(s) for s in suggestions(plan)] if not plan.fits
        else [],
        "stages": [_stage_json(s) for s in plan.stages],
        "groups": [dataclasses.asdict(g) for g in plan.groups], "drawing": plan.drawing,
        "bubble": {"1f1b": dataclasses.asdict(plan.bubble_1f1b),
                   "interleaved": dataclasses.asdict(plan.bubble_interleaved)
                   if plan.bubble_interleaved else None},
        "in_flight_stage0": plan.in_flight, "batch": dataclasses.asdict(plan.batch),
        "notes": plan.notes,
        "warnings": plan.warnings,
    }


def phase_fit_lines(launches: list[tuple[Any, int, Plan]]) -> list[str]:
    """A run in phases: one line per launch (its phase, steps and layout) saying whether its
    worst rank fits, and for one that does not the planner's one-line refusal with its fix
    (a run's fit is each launch's; scripts/launch.py and pretrain.py refuse it)."""
    if not launches:
        return []
    count = len(launches)
    lines = [f"phases: {count} launch{'' if count == 1 else 'es'}, each in its phase's layout:"]
    for span, end, plan in launches:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"  {span.name} (steps {span.start_step:,}-{end:,}, seq "
                     f"{span.seq_length:,}, CP{span.context}, micro-batch "
                     f"{span.micro_batch_size}): worst rank {size_text(plan.worst.peak)} of "
                     f"{size_text(plan.cluster.gpu_memory_bytes)}: {verdict}")
        if not plan.fits:
            lines.append(f"    {refusal(plan)}")
    return lines


def phase_fits_json(launches: list[tuple[Any, int, Plan]]) -> list[dict[str, Any]]:
    """`phase_fit_lines` for tools: each launch's phase, steps, layout and worst rank."""
    return [{"phase": span.name, "start_step": span.start_step, "end_step": end,
             "seq_length": span.seq_length, "context": span.context,
             "micro_batch_size": span.micro_batch_size, "peak_bytes": plan.worst.peak,
             "gpu_memory_bytes": plan.cluster.gpu_memory_bytes, "fits": plan.fits}
            for span, end, plan in launches]

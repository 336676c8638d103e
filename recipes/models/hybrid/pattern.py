"""The hybrid layer pattern (Megatron Core's `hybrid_layer_pattern`): its symbols and stage split.

A hybrid model is a string with one symbol per layer: `M` a Mamba2 mixer, `*` self-attention,
`-` an MLP, `E` a mixture-of-experts MLP; `|` cuts it into pipeline segments. Megatron Core
reads it in `models/hybrid/hybrid_layer_allocation.py`: with `|`, segment vp·PP + pp goes to
pipeline rank pp, virtual stage vp (`select_pipeline_segment`, l.331-493); without `|`, the
layers are split evenly over PP (or by the first/last stage counts) and VPP is refused.
No torch: the layout object, the planner and the dry run read the same stage split; what
Megatron would assert on is refused first by `rules.py`.
"""

from __future__ import annotations

from typing import Any

from recipes.models.kinds import ATTENTION, LAYER_SYMBOLS, MAMBA, MLP, MOE, SYMBOL_NAMES  # noqa: F401

PIPE = "|"
# Megatron's other symbols (G gated delta net, D DeepSeek sparse attention, + MLA, / MTP
# depths) have no spec, recipe or check here yet.
MEGATRON_ONLY = {"G": "gated delta net", "D": "sparse attention", "+": "MLA",
                  "/": "multi-token prediction"}


def segments(pattern: str) -> list[str]:
    """The pattern's pipeline segments (one when it has no `|`)."""
    return pattern.split(PIPE)


def layer_symbols(pattern: str) -> str:
    """The layers alone, without stage boundaries."""
    return pattern.replace(PIPE, "")


def has_pipes(pattern: str | None) -> bool:
    return pattern is not None and PIPE in pattern


def chunk_patterns(pattern: str, pipeline: int, virtual: int | None,
                   first: int | None = None, last: int | None = None) -> list[list[str]]:
    """Layer symbols of every model chunk as Megatron assigns them: [pp stage][virtual stage].

    With `|`: segment vp·PP + pp; without: an even split over the stages, or the first and last
    stage's own counts with the middle stages sharing the rest (validation has made every
    division exact)."""
    vpp = virtual or 1
    if has_pipes(pattern):
        parts = segments(pattern)
        return [[parts[vp * pipeline + pp] for vp in range(vpp)] for pp in range(pipeline)]
    layers = layer_symbols(pattern)
    counts = stage_counts(len(layers), pipeline, first, last)
    starts = [sum(counts[:pp]) for pp in range(pipeline)]
    return [[layers[start:start + count]] for start, count in zip(starts, counts, strict=True)]


def stage_counts(layers: int, pipeline: int, first: int | None, last: int | None) -> list[int]:
    """Layers on each stage of a split without `|` (Megatron's uneven first/last stages)."""
    if pipeline == 1 or (first is None and last is None):
        return [layers // pipeline] * pipeline
    middle = pipeline - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    counts = [rest // middle if middle else 0] * pipeline
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def mamba_heads(m: Any) -> int:
    """Mamba heads: as set, or Megatron's default d_inner / head_dim with d_inner = 2 x hidden
    (`ssm/mamba_mixer.py:216, 243-249`)."""
    if m.mamba_num_heads is not None:
        return m.mamba_num_heads
    return 2 * m.hidden_size // m.mamba_head_dim


def count(m: Any, symbol: str) -> int:
    """Layers of one kind in a hybrid model's pattern."""
    return layer_symbols(m.hybrid_layer_pattern).count(symbol)

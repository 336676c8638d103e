"""The hybrid layer pattern (Megatron Core's `hybrid_layer_pattern`): its symbols and stage split.

A hybrid model is a string with one symbol per layer: `M` a Mamba2 mixer, `*` self-attention,
`-` an MLP, `E` a mixture-of-experts MLP; `|` cuts it into pipeline segments; after `/`, each
part is one multi-token-prediction (MTP) depth, e.g. `M*ME/*E/*E` (two depths, each an
attention and an MoE layer). Megatron Core reads it in `models/hybrid/hybrid_layer_allocation.py`:
the main pattern is everything before the first `/` (`parse_hybrid_pattern`, l.189-265; every
depth must be the same layers, without `|`); with `|`, segment vp·PP + pp goes to pipeline rank
pp, virtual stage vp (`select_pipeline_segment`, l.331-493); without `|`, the layers are split
evenly over PP (or by the first/last stage counts) and VPP is refused. The MTP block is built
on the last pipeline stage's last virtual stage only (`models/hybrid/hybrid_model.py:217-229`,
`transformer/multi_token_prediction.py:1672`), with a copy of the input embedding there.
No torch: the layout object, the planner and the dry run read the same stage split; what
Megatron would assert on is refused first by `rules.py`.
"""

from __future__ import annotations

from typing import Any

from recipes.models.kinds import ATTENTION, LAYER_SYMBOLS, MAMBA, MLP, MOE, SYMBOL_NAMES  # noqa: F401

PIPE = "|"
MTP = "/"  # Megatron's MTP separator (`Symbols.MTP_SEPARATOR`)
# Megatron's other symbols (G gated delta net, D DeepSeek sparse attention, + MLA) have no
# spec, recipe or check here yet.
MEGATRON_ONLY = {"G": "gated delta net", "D": "sparse attention", "+": "MLA"}


def main_pattern(pattern: str) -> str:
    """The main decoder's pattern: everything before the first `/` (stage cuts kept)."""
    return pattern.split(MTP)[0]


def mtp_parts(pattern: str | None) -> list[str]:
    """The pattern of every MTP depth, as written (empty: no MTP)."""
    if pattern is None or MTP not in pattern:
        return []
    parts = pattern.split(MTP)[1:]
    return [] if all(part == "" for part in parts) else parts


def mtp_depths(pattern: str | None) -> int:
    """MTP depths the pattern gives (Megatron's `mtp_num_layers`; 0 without MTP)."""
    return len(mtp_parts(pattern))


def mtp_pattern(pattern: str | None) -> str:
    """The layers of one MTP depth (every depth is the same; '' without MTP)."""
    parts = mtp_parts(pattern)
    return parts[0] if parts else ""


def segments(pattern: str) -> list[str]:
    """The main pattern's pipeline segments (one when it has no `|`)."""
    return main_pattern(pattern).split(PIPE)


def layer_symbols(pattern: str) -> str:
    """The main decoder's layers alone, without stage boundaries or MTP depths."""
    return main_pattern(pattern).replace(PIPE, "")


def has_pipes(pattern: str | None) -> bool:
    return pattern is not None and PIPE in main_pattern(pattern)


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
    """Layers of one kind in a hybrid model's main decoder (MTP layers: `mtp_count`)."""
    return layer_symbols(m.hybrid_layer_pattern).count(symbol)


def mtp_count(m: Any, symbol: str) -> int:
    """Layers of one kind the MTP block runs per token: each depth's, over every depth (with
    `model.mtp_use_repeated_layer` one set of weights runs at every depth)."""
    return mtp_pattern(m.hybrid_layer_pattern).count(symbol) * mtp_depths(m.hybrid_layer_pattern)


def mtp_built(m: Any) -> int:
    """MTP depths that hold weights of their own: one when the depths share a layer."""
    depths = mtp_depths(m.hybrid_layer_pattern)
    return min(depths, 1) if m.mtp_use_repeated_layer else depths

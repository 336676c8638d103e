"""A hybrid model's rules: what Megatron would assert on, or silently ignore, refused first.

One pure rule each, in the form of `recipes/config/validation.py` (None when it holds, else
the one line naming the field, its value and the fix): the pattern's symbols and length, its
`|` segments against PP x VPP (Megatron asserts only a multiple of PP and never builds the
segments past PP x VPP), virtual stages without `|`, uneven stages beside `|`, experts and `E`
layers together, positions, the Mamba heads and groups against TP and CP, and the MTP depths
after `/` (identical, non-empty, no `|`; their settings only with depths; not with packed rows
under CP, whose padded documents Megatron's MTP roll does not see; under full recompute only
with one layer per recompute block, which Megatron asserts mid-run).

MTP depths need no pipeline rule: Megatron builds them on the last stage's last virtual stage
whatever the cut (`models/hybrid/hybrid_model.py:217-229`), with a copy of the embedding there
kept equal to the first stage's (`models/common/language_module/language_module.py:247-300`);
the layout, the planner and the dry run count them there.
"""

from __future__ import annotations

import math
from typing import Any

from recipes.models.hybrid.pattern import (
    LAYER_SYMBOLS,
    MAMBA,
    MEGATRON_ONLY,
    MOE,
    MTP,
    PIPE,
    has_pipes,
    layer_symbols,
    mamba_heads,
    mtp_depths,
    mtp_parts,
    segments,
)

SYMBOLS_HELP = ("use M (Mamba2), * (attention), - (MLP), E (MoE), | (stage boundary) and / "
                "(an MTP depth)")


def check_hybrid_symbols(cfg: Any) -> str | None:
    """Only the four layer symbols, `|` and `/`; Megatron's others are named, not guessed at."""
    pattern = cfg.model.hybrid_layer_pattern
    if pattern is None:
        return None
    for char in pattern:
        if char in MEGATRON_ONLY:
            return (f"model.hybrid_layer_pattern uses '{char}' ({MEGATRON_ONLY[char]}), which "
                    f"no layer spec here builds; {SYMBOLS_HELP}")
        if char not in LAYER_SYMBOLS and char not in (PIPE, MTP):
            return (f"model.hybrid_layer_pattern={pattern} has the unknown symbol '{char}'; "
                    f"{SYMBOLS_HELP}")
    return None


def check_mtp_depths(cfg: Any) -> str | None:
    """Every part after `/` is one MTP depth: the same layers each time, none empty, no stage
    cut (Megatron raises on different depths and on `|` in them, `models/hybrid/
    hybrid_layer_allocation.py:246-262`; a trailing `/` alone silently builds no MTP)."""
    pattern = cfg.model.hybrid_layer_pattern
    if pattern is None or MTP not in pattern:
        return None
    parts = pattern.split(MTP)[1:]
    if not mtp_parts(pattern) or any(not part for part in parts):
        return (f"model.hybrid_layer_pattern={pattern} has an empty MTP depth ('/' with no "
                "layers after it); write each depth's layers after its '/', e.g. M*ME/*E/*E, "
                "or drop the '/'")
    if any(PIPE in part for part in parts):
        return (f"model.hybrid_layer_pattern={pattern} cuts an MTP depth with '|'; MTP layers "
                "all live on the last pipeline stage: put '|' before the first '/' only")
    if len(set(parts)) > 1:
        return (f"model.hybrid_layer_pattern={pattern} has MTP depths of different layers "
                f"({', '.join(parts)}); Megatron builds every depth alike: repeat one depth's "
                "layers after each '/'")
    return None


def check_mtp_settings_need_depths(cfg: Any) -> str | None:
    """MTP settings on a model without MTP depths would be silently ignored."""
    m = cfg.model
    if mtp_depths(m.hybrid_layer_pattern):
        return None
    for key, value, default in (("mtp_loss_scaling_factor", m.mtp_loss_scaling_factor, 0.1),
                                ("mtp_use_repeated_layer", m.mtp_use_repeated_layer, False)):
        if value != default:
            return (f"model.{key}={value} needs MTP depths, but model.hybrid_layer_pattern has "
                    "no '/'; add depths (e.g. ...ME/*E/*E) or leave model."
                    f"{key} at its default")
    return None


def check_mtp_loss_scale(cfg: Any) -> str | None:
    """The MTP loss is added to the LM loss times this factor: it must be positive (0 would
    build and run MTP layers that never learn)."""
    m = cfg.model
    if not mtp_depths(m.hybrid_layer_pattern) or m.mtp_loss_scaling_factor > 0:
        return None
    return (f"model.mtp_loss_scaling_factor={m.mtp_loss_scaling_factor:g} must be positive; "
            "set it, e.g. 0.3 (Nemotron 3 Super), or remove the MTP depths after '/'")


def check_mtp_packed_context_parallel(cfg: Any) -> str | None:
    """Under CP a packed row pads every document to a multiple of 2 x CP; Megatron's MTP shifts
    tokens by `cu_seqlens_q`, the unpadded lengths (`transformer/multi_token_prediction.py:
    249-282`), so it would mix documents and padding."""
    m, p = cfg.model, cfg.parallel
    if not mtp_depths(m.hybrid_layer_pattern) or p.context == 1 or not cfg.data.packed_rows:
        return None
    return (f"MTP depths with data.documents={cfg.data.documents} (packed rows) and "
            f"parallel.context={p.context}: Megatron's MTP shifts packed tokens by the unpadded "
            "document lengths, which CP's padding breaks; set parallel.context=1, "
            "data.documents=concatenate, or remove the MTP depths")


def check_mtp_full_recompute_blocks(cfg: Any) -> str | None:
    """Full recompute checkpoints each MTP depth as one block, and Megatron asserts
    `recompute_num_layers == 1` there (`transformer/multi_token_prediction.py:1415-1421`): a
    larger block would build and then stop at the first training forward."""
    m, t = cfg.model, cfg.train
    if t.recompute != "full" or t.recompute_num_layers == 1:
        return None
    if not mtp_depths(m.hybrid_layer_pattern):
        return None
    return (f"train.recompute_num_layers={t.recompute_num_layers} with train.recompute=full and "
            "MTP depths (model.hybrid_layer_pattern after '/'): Megatron recomputes MTP only "
            "one layer per block; set train.recompute_num_layers=1, or train.recompute="
            "selective, or remove the MTP depths")


def check_hybrid_length(cfg: Any) -> str | None:
    """One symbol per layer: the pattern's layers are the model's layers."""
    m = cfg.model
    if m.hybrid_layer_pattern is None:
        return None
    layers = len(layer_symbols(m.hybrid_layer_pattern))
    if layers != m.num_layers:
        return (f"model.hybrid_layer_pattern has {layers} layers but model.num_layers="
                f"{m.num_layers}; set model.num_layers={layers} or fix the pattern")
    return None


def check_hybrid_segments(cfg: Any) -> str | None:
    """With `|`, one non-empty segment per model chunk: PP x VPP of them (Megatron asserts
    only a multiple of PP and builds none of the segments past PP x VPP)."""
    m, p = cfg.model, cfg.parallel
    if not has_pipes(m.hybrid_layer_pattern):
        return None
    parts, vpp = segments(m.hybrid_layer_pattern), p.virtual_pipeline or 1
    if any(not part for part in parts):
        return ("model.hybrid_layer_pattern has an empty pipeline segment ('||', or '|' at an "
                "end); give every segment at least one layer")
    chunks = p.pipeline * vpp
    if len(parts) != chunks:
        split = f"PP{p.pipeline} x VPP{vpp}" if vpp > 1 else f"PP{p.pipeline}"
        return (f"model.hybrid_layer_pattern has {len(parts)} '|' segments but {split} needs "
                f"{chunks}; cut the pattern into {chunks} segments or change the pipeline sizes")
    return None


def check_hybrid_virtual_needs_pipes(cfg: Any) -> str | None:
    """Megatron refuses virtual stages without explicit segment boundaries."""
    m, p = cfg.model, cfg.parallel
    if m.hybrid_layer_pattern is None or p.virtual_pipeline is None:
        return None
    if not has_pipes(m.hybrid_layer_pattern):
        return (f"parallel.virtual_pipeline={p.virtual_pipeline} with a hybrid model needs '|' "
                f"in model.hybrid_layer_pattern ({p.pipeline * p.virtual_pipeline} segments, "
                "one per model chunk); add them or set parallel.virtual_pipeline=null")
    return None


def check_hybrid_uneven_with_pipes(cfg: Any) -> str | None:
    """`|` already places every layer; Megatron refuses the first/last stage counts beside it."""
    m, p = cfg.model, cfg.parallel
    if not has_pipes(m.hybrid_layer_pattern):
        return None
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        return ("parallel.first_stage_layers/last_stage_layers cannot be used with '|' in "
                "model.hybrid_layer_pattern (the segments place the layers); set them to null")
    return None


def check_mamba_heads(cfg: Any) -> str | None:
    """Whole heads per group and a whole d_inner (`ssm/mamba_mixer.py:243-272`)."""
    m = cfg.model
    if m.hybrid_layer_pattern is None or MAMBA not in m.hybrid_layer_pattern:
        return None
    if m.mamba_num_heads is None and (2 * m.hidden_size) % m.mamba_head_dim:
        return (f"model.mamba_head_dim={m.mamba_head_dim} does not divide d_inner = 2 x "
                f"model.hidden_size = {2 * m.hidden_size}; set model.mamba_num_heads or a head "
                "width that divides it")
    heads = mamba_heads(m)
    if heads % m.mamba_num_groups:
        return (f"Mamba heads ({heads}) are not divisible by model.mamba_num_groups="
                f"{m.mamba_num_groups}; choose a group count that divides the heads")
    return None


def check_mamba_tensor_parallel(cfg: Any) -> str | None:
    """Each TP rank holds whole Mamba heads and whole groups (`ssm/mamba_mixer.py:260-272`)."""
    m, tp = cfg.model, cfg.parallel.tensor
    if m.hybrid_layer_pattern is None or MAMBA not in m.hybrid_layer_pattern:
        return None
    heads = mamba_heads(m)
    if heads % tp:
        return (f"Mamba heads ({heads}) are not divisible by parallel.tensor={tp}; set "
                "model.mamba_num_heads or a TP size that divides them")
    if m.mamba_num_groups % tp:
        return (f"model.mamba_num_groups={m.mamba_num_groups} is not divisible by "
                f"parallel.tensor={tp}; choose a TP size that divides the Mamba groups")
    return None


def check_mamba_context_parallel(cfg: Any) -> str | None:
    """Megatron's Mamba CP gives each CP rank whole heads of the TP rank's share, and groups
    that split evenly or repeat evenly (`ssm/mamba_context_parallel.py:105-130`)."""
    m, p = cfg.model, cfg.parallel
    if m.hybrid_layer_pattern is None or MAMBA not in m.hybrid_layer_pattern or p.context == 1:
        return None
    heads_tp, groups_tp = mamba_heads(m) // p.tensor, m.mamba_num_groups // p.tensor
    if heads_tp % p.context:
        return (f"Mamba heads per TP rank ({heads_tp}) are not divisible by parallel.context="
                f"{p.context}; lower CP or TP, or raise model.mamba_num_heads")
    if math.gcd(groups_tp, p.context) not in (groups_tp, p.context):
        return (f"Mamba groups per TP rank ({groups_tp}) and parallel.context={p.context} must "
                "divide one another; change model.mamba_num_groups or the CP size")
    return None


def check_hybrid_experts(cfg: Any) -> str | None:
    """`E` layers need experts, and experts need `E` layers (else they would be built nowhere)."""
    m = cfg.model
    if m.hybrid_layer_pattern is None:
        return None
    has_moe = MOE in m.hybrid_layer_pattern
    if has_moe and m.num_moe_experts is None:
        return ("model.hybrid_layer_pattern has E (MoE) layers but model.num_moe_experts is not "
                "set; set it, e.g. model.num_moe_experts=8, or use - (MLP) layers")
    if not has_moe and m.num_moe_experts is not None:
        return (f"model.num_moe_experts={m.num_moe_experts} but model.hybrid_layer_pattern has no "
                "E (MoE) layer; add E layers or set model.num_moe_experts=null")
    return None


def check_hybrid_positions(cfg: Any) -> str | None:
    """Learned absolute positions are not what a hybrid model uses (Mamba layers carry order);
    HybridModel takes rope or none."""
    m = cfg.model
    if m.hybrid_layer_pattern is not None and m.position_embedding == "learned_absolute":
        return ("model.position_embedding=learned_absolute with a hybrid model; set "
                "model.position_embedding=none (Nemotron-H) or rope")
    return None


RULES = (
    check_hybrid_symbols,
    check_mtp_depths,
    check_mtp_settings_need_depths,
    check_mtp_loss_scale,
    check_mtp_packed_context_parallel,
    check_mtp_full_recompute_blocks,
    check_hybrid_length,
    check_hybrid_segments,
    check_hybrid_virtual_needs_pipes,
    check_hybrid_uneven_with_pipes,
    check_hybrid_experts,
    check_hybrid_positions,
    check_mamba_heads,
    check_mamba_tensor_parallel,
    check_mamba_context_parallel,
)

"""The GPT family's shape rules: attention heads against TP, grouped-query attention, head width,
the share of a head RoPE rotates and the norm's zero-centred gamma.

One pure rule each, in the form of `recipes/config/validation.py`. Every model with attention
layers meets them: GPT models and the `*` layers of hybrid ones.
"""

from __future__ import annotations

from typing import Any


def check_heads_divisible_by_tensor(cfg: Any) -> str | None:
    """Each TP rank holds whole query heads, and whole KV heads or a copy of one."""
    m, tp = cfg.model, cfg.parallel.tensor
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % tp:
        return (
            f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
            f"parallel.tensor={tp}; choose a TP size that divides the head count"
        )
    if groups % tp and tp % groups:
        # Fewer KV heads than TP ranks is allowed: each KV head is then copied to TP / groups
        # ranks (`transformer/attention.py:353-360`, `transformer_config.py:1338-1345`).
        return (
            f"model.num_query_groups={groups} (KV heads) and parallel.tensor={tp} must divide "
            "one another; choose a TP size that divides the KV head count or is a multiple of it"
        )


def check_query_groups(cfg: Any) -> str | None:
    """Grouped-query attention: every KV head serves the same number of query heads."""
    m = cfg.model
    groups = m.num_query_groups
    if groups is not None and m.num_attention_heads % groups:
        return (
            f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
            f"model.num_query_groups={groups}; set num_query_groups to a divisor of the heads"
        )


def check_head_width(cfg: Any) -> str | None:
    """Without explicit kv_channels the head width is hidden / heads and must be whole."""
    m = cfg.model
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        return (
            f"model.hidden_size={m.hidden_size} is not divisible by "
            f"model.num_attention_heads={m.num_attention_heads}; change one of them or set "
            "model.kv_channels explicitly"
        )


def check_rotary_percent_range(cfg: Any) -> str | None:
    """A share of the head's channels: Megatron narrows RoPE only below 1 and silently rotates
    the whole head above it (`models/common/embeddings/rotary_pos_embedding.py:72-74`)."""
    share = cfg.model.rotary_percent
    if 0 < share <= 1:
        return None
    return (f"model.rotary_percent={share:g} must be in (0, 1], the share of each head's "
            "channels RoPE rotates; set it, e.g. model.rotary_percent=0.5 (Nemotron-4) or 1.0")


def check_rotary_percent_needs_rope(cfg: Any) -> str | None:
    """Only rotary position embeddings rotate channels; elsewhere the share would do nothing."""
    m = cfg.model
    if m.rotary_percent == 1.0 or m.position_embedding == "rope":
        return None
    return (f"model.rotary_percent={m.rotary_percent:g} only applies to RoPE, but "
            f"model.position_embedding={m.position_embedding}; set model.position_embedding=rope "
            "or model.rotary_percent=1.0")


def rotary_channels(m: Any) -> int:
    """Channels of one head RoPE rotates, as Megatron truncates them (rotary_pos_embedding.py:
    72-74)."""
    width = m.kv_channels or m.hidden_size // m.num_attention_heads
    return int(width * m.rotary_percent) if m.rotary_percent < 1.0 else width


def check_rotary_channels_even(cfg: Any) -> str | None:
    """RoPE turns channel pairs: Megatron builds one frequency per pair and repeats the table
    (`rotary_pos_embedding.py:78-80, 191`), so an odd count gives a table one channel wider than
    the part it rotates and the first forward fails on the shapes (`rope_utils.py:121-124`)."""
    m = cfg.model
    if m.position_embedding != "rope" or not 0 < m.rotary_percent <= 1:
        return None
    if not m.kv_channels and m.hidden_size % m.num_attention_heads:
        return None  # no whole head width: the head-count rule says so, and this would follow
    channels = rotary_channels(m)
    if channels >= 2 and channels % 2 == 0:
        return None
    width = m.kv_channels or m.hidden_size // m.num_attention_heads
    if width % 2:  # no share turns an odd head width into pairs whole: the width is the fix
        return (f"model.rotary_percent={m.rotary_percent:g} rotates {channels} of a head's "
                f"{width} channels; RoPE turns channel pairs, so a head needs an even width: "
                f"set model.kv_channels to an even number, e.g. {width + 1}")
    example = 0.5 if width % 4 == 0 else 1.0
    return (f"model.rotary_percent={m.rotary_percent:g} rotates {channels} of a head's {width} "
            "channels; RoPE turns channel pairs, so the count must be even and at least 2: choose "
            f"a share that gives one, e.g. model.rotary_percent={example:g}")


def check_zero_centered_gamma_layers(cfg: Any) -> str | None:
    """Megatron's local norm (torch's) asserts against a zero-centred gamma
    (`transformer/torch_norm.py:44-46`); Transformer Engine's norms take it. CPU ranks are
    refused by the machine check (`recipes/config/machine.py`)."""
    m = cfg.model
    if not m.layernorm_zero_centered_gamma or m.transformer_impl != "local":
        return None
    return ("model.layernorm_zero_centered_gamma=true needs Transformer Engine's norms, but "
            "model.transformer_impl=local builds torch's, which refuse it; set "
            "model.transformer_impl=auto or model.layernorm_zero_centered_gamma=false")


RULES = (check_heads_divisible_by_tensor, check_query_groups, check_head_width,
         check_rotary_percent_range, check_rotary_percent_needs_rope, check_rotary_channels_even,
         check_zero_centered_gamma_layers)

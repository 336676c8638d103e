"""The GPT family's shape rules: attention heads against TP, grouped-query attention, head width.

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


RULES = (check_heads_divisible_by_tensor, check_query_groups, check_head_width)

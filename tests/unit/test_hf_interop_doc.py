"""What docs/hf-interop.md tells a user to type for the vocabulary padding works as it says,
and the page no longer calls Nemotron 3 Super refused (its tiny model imports and exports:
tests/dist/test_hf_interop.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.resolve import resolve_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "hf-interop.md"


def test_a_tp_beyond_the_recipes_cluster_needs_the_cluster_too() -> None:
    with pytest.raises(ConfigError, match="world size 1 .* is not divisible by TP2"):
        resolve_config(["recipe=hf_tiny_llama", "parallel.tensor=2"])
    cfg = resolve_config(["recipe=hf_tiny_llama", "parallel.tensor=2",
                          "cluster.gpus_per_node=2"])
    assert cfg.parallel.tensor == 2


def test_a_tp_within_the_recipes_cluster_is_enough() -> None:
    assert resolve_config(["recipe=llama3_8b_tp8_dp8", "parallel.tensor=4"]).parallel.tensor == 4


def test_the_page_quotes_the_commands_and_maps_super() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert "`recipe=hf_tiny_llama parallel.tensor=2 cluster.gpus_per_node=2`" in text
    assert "`recipe=llama3_8b_tp8_dp8 parallel.tensor=4`" in text
    assert "(or `parallel.tensor=`)" not in text
    assert "multi-token prediction) is refused" not in text

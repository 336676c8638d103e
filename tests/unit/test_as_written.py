"""`as_written`: the one form in which a message or a printed command writes a value as a
`key=value` word. What it writes must read back as the same value: a refusal's suggested fix,
the planner's search commands and a Hugging Face mismatch's override are typed as shown.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import as_written, convert
from recipes.config.overrides import apply_overrides, field_type
from recipes.plan.search import Candidate, apply_candidate
from recipes.registry import get_recipe
from trainer.models.gpt.hf_config import compare_with_recipe, hf_config_for


def _value(cfg, key: str):
    return functools.reduce(getattr, key.split("."), cfg)


@pytest.mark.parametrize(("key", "value"), [
    ("parallel.virtual_pipeline", None), ("optimizer.distributed", True),
    ("optimizer.distributed", False), ("parallel.tensor", 2), ("optimizer.lr", 3e-4),
    ("optimizer.fsdp", "optim_grads"), ("checkpoint.load", None)])
def test_a_value_as_written_reads_back_through_the_override_and_the_scripts_parsers(key, value):
    text = as_written(value)
    assert _value(apply_overrides(get_recipe("tiny_dp1"), [f"{key}={text}"]), key) == value
    assert convert(key, text, field_type(key), f"{key}=...") == value


@pytest.mark.parametrize("candidate", [
    Candidate(1, 1, None, None, None, 1, 1, None, 1, False, "full", True),
    Candidate(2, 2, 2, 1, 1, 1, 1, None, 2, True, "selective", False, "none", True),
], ids=["nulls", "values"])
@pytest.mark.parametrize("batched", [False, True], ids=["p2p", "batched_p2p"])
def test_a_search_layouts_command_trains_the_layout_it_ranked(candidate, batched):
    """What the search prints after the recipe (`Candidate.overrides`) builds the very config
    it planned (`apply_candidate`): None as null, a bool as true/false; an interleaved layout
    of a recipe that batches its pipeline sends turns that off, as the plan did."""
    cfg = apply_overrides(get_recipe("tiny_dp1"), [f"parallel.batch_p2p_comm={batched}"])
    typed = apply_overrides(cfg, candidate.overrides())
    planned = apply_candidate(cfg, candidate)
    for section in ("parallel", "train", "optimizer"):
        assert dataclasses.asdict(getattr(typed, section)) == \
            dataclasses.asdict(getattr(planned, section))


def test_a_hugging_face_rope_theta_mismatch_names_an_override_the_schema_takes():
    """rope_theta is compared as a float, model.rotary_base is an integer: the override named
    is `model.rotary_base=10000` (an override refuses 10000.0), and with it the recipe is the
    model."""
    model = get_recipe("hf_tiny_llama").model
    hf = {**hf_config_for(model, "bfloat16"), "rope_theta": 10000.0}
    with pytest.raises(ConfigError) as refused:
        compare_with_recipe(hf, model, "hf_tiny_llama")
    fix = re.search(r"override (model\.rotary_base=\S+)$", str(refused.value))
    assert fix is not None and fix.group(1) == "model.rotary_base=10000"
    fixed = apply_overrides(get_recipe("hf_tiny_llama"), [fix.group(1)])
    compare_with_recipe(hf, fixed.model, "hf_tiny_llama")

"""A config.json field the mappings read inside of with the wrong JSON shape (`"rope_scaling":
"x"`, block types as a number, a block type that is a list) is one line naming config.json, the
field, its value and the shape it must have (`hf_config.wrong_shape`, from every family's
`HF_NESTED`), before any value inside it is looked up: not an AttributeError in `_lookup` or a
family's reader. The rule fires alone; null stays allowed (absent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import config_json
from trainer.interop import hf_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama() -> dict:
    return config_json("llama", "LlamaForCausalLM")


@pytest.fixture(scope="module")
def nemotron() -> dict:
    return config_json("nemotron_h", "NemotronHForCausalLM")


def test_every_family_states_what_it_reads_inside_of() -> None:
    assert hf_config.NESTED == {
        "rope_parameters": "object", "rope_scaling": "object", "layers_block_type": "names",
        "layer_types": "names", "mtp_layers_block_type": "names", "time_step_limit": "list",
        "mamba_dt_limit": "list"}


def test_rope_scaling_as_a_string_is_one_line(llama) -> None:
    assert hf_config.wrong_shape({**llama, "rope_scaling": "x"}) == (
        'config.json rope_scaling="x" is a string, not an object ({...}); write it as an '
        "object ({...}) or null, or re-download the model's config.json")


@pytest.mark.parametrize("key, value, miss", [
    ("rope_parameters", [1, 2], "a list"),
    ("rope_scaling", 8.0, "a decimal number"),
    ("layers_block_type", 4, "an integer"),
    ("layer_types", "mamba", "a string"),
    ("mtp_layers_block_type", {"a": 1}, "an object"),
    ("time_step_limit", "0,inf", "a string"),
    ("mamba_dt_limit", True, "a boolean"),
    ("layers_block_type", ["mamba", ["moe"]], 'a list holding ["moe"], a list'),
])
def test_each_nested_field_of_the_wrong_shape_is_named(llama, key, value, miss) -> None:
    line = hf_config.wrong_shape({**llama, key: value})
    assert line.startswith(f"config.json {key}={json.dumps(value)} is {miss}, not ")


def test_a_long_value_is_cut(nemotron) -> None:
    line = hf_config.wrong_shape({**nemotron, "layers_block_type": [7] * 100})
    shown = json.dumps([7] * 100)[:57] + "..."  # 60 characters of the 300
    assert line.startswith(f"config.json layers_block_type={shown} is a list holding 7, an "
                           "integer, not a list of names")


def test_right_shapes_and_null_pass(llama, nemotron) -> None:
    assert hf_config.wrong_shape(llama) is None
    assert hf_config.wrong_shape(nemotron) is None
    assert hf_config.wrong_shape({**llama, "rope_scaling": None,
                                  "layers_block_type": None}) is None


def test_lookup_inside_a_non_object_is_absent(llama) -> None:
    """`wrong_type` alone reads past it (the shape is `wrong_shape`'s to name)."""
    assert hf_config._lookup({"rope_scaling": "x"}, "rope_scaling.factor") == (False, None)
    assert hf_config.wrong_type({**llama, "rope_scaling": "x"}) is None


@pytest.mark.parametrize("recipe, fixture, key, value", [
    ("hf_tiny_llama", "llama", "rope_scaling", "x"),
    ("hf_tiny_llama", "llama", "rope_parameters", ["x"]),
    ("hf_tiny_nemotron_h", "nemotron", "layers_block_type", 3),
    ("hf_tiny_nemotron_h", "nemotron", "time_step_limit", "x"),
])
def test_the_recipe_comparison_refuses_it_first(request, recipe, fixture, key, value) -> None:
    config = {**request.getfixturevalue(fixture), key: value}
    with pytest.raises(ConfigError, match=rf"^config\.json {key}=.* is .*, not "):
        hf_config.compare_with_recipe(config, get_recipe(recipe).model, recipe)


def test_convert_import_refuses_it_in_one_line(tmp_path, llama) -> None:
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**llama, "rope_scaling": "x"}))
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}",
         f"out={tmp_path / 'out'}", "recipe=hf_tiny_llama"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ('error: config.json rope_scaling="x" is a string, not an object '
                           "({...}); write it as an object ({...}) or null, or re-download the "
                           "model's config.json\n")
    assert not (tmp_path / "out").exists()

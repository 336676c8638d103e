"""A broken config.json or a recipe of another architecture is one line before any output:
`architectures` as a string, absent `architectures` (read through `model_type`, as transformers'
AutoConfig does, when one architecture has it), a value of the wrong JSON type, a size no model
has, and a Mixtral recipe for a Llama directory (that alone, not six field differences with
overrides); each rule fires alone (`trainer/interop/hf_config.py`)."""

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
def mixtral() -> dict:
    return config_json("mixtral", "MixtralForCausalLM")


def _without(config: dict, *keys: str) -> dict:
    return {key: value for key, value in config.items() if key not in keys}


# 1. architectures not a list
def test_architectures_as_a_string_is_refused_as_not_a_list(llama) -> None:
    with pytest.raises(ConfigError) as caught:
        hf_config.listed_architectures({**llama, "architectures": "LlamaForCausalLM"})
    assert str(caught.value) == (
        'config.json "architectures": "LlamaForCausalLM" is not a list of class names; write it '
        'as a list, e.g. "architectures": ["LlamaForCausalLM"]')


def test_a_list_of_names_is_listed(llama) -> None:
    assert hf_config.listed_architectures(llama) == ["LlamaForCausalLM"]
    assert hf_config.listed_architectures(_without(llama, "architectures")) == []


# 2. no architectures: the one model_type names
@pytest.mark.parametrize("model_type, expected", [
    ("llama", "LlamaForCausalLM"), ("mixtral", "MixtralForCausalLM"),
    ("nemotron_h", "NemotronHForCausalLM")])
def test_without_architectures_model_type_names_it(model_type, expected) -> None:
    assert hf_config.architecture_of_model_type({"model_type": model_type}) == expected
    assert hf_config.architecture({"model_type": model_type}) == expected


def test_without_architectures_or_model_type_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        hf_config.architecture_of_model_type({"hidden_size": 64})
    assert str(caught.value) == (
        'config.json has neither architectures nor model_type; add the model\'s class, e.g. '
        '"architectures": ["LlamaForCausalLM"]')


def test_an_unmapped_model_type_without_architectures_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        hf_config.architecture_of_model_type({"model_type": "gpt2"})
    assert str(caught.value) == (
        'config.json has no architectures and its model_type "gpt2" is not mapped; supported: '
        "llama (LlamaForCausalLM), mixtral (MixtralForCausalLM), nemotron_h "
        "(NemotronHForCausalLM)")


def test_a_mixtral_config_with_model_type_only_matches_its_recipe(mixtral) -> None:
    """The families read the mapped architecture (Mixtral's MoE fields), not model_type."""
    config = _without(mixtral, "architectures")
    assert hf_config.family(config) == "mixtral"
    hf_config.compare_with_recipe(config, get_recipe("hf_tiny_mixtral").model, "hf_tiny_mixtral")


# 3. a value of the wrong JSON type
@pytest.mark.parametrize("key, value, line", [
    ("hidden_size", "64", 'hidden_size="64" is a string, not an integer'),
    ("hidden_size", 64.0, "hidden_size=64.0 is a decimal number, not an integer"),
    ("num_hidden_layers", True, "num_hidden_layers=true is a boolean, not an integer"),
    ("vocab_size", None, "vocab_size=null is null, not an integer"),
    ("tie_word_embeddings", "false", 'tie_word_embeddings="false" is a string, not true or false'),
    ("rms_norm_eps", "1e-5", 'rms_norm_eps="1e-5" is a string, not a number'),
])
def test_a_value_of_the_wrong_type_is_named_with_the_expected_type(llama, key, value,
                                                                   line) -> None:
    kind = line.rsplit("not ", 1)[1]
    assert hf_config.wrong_type({**llama, key: value}) == (
        f"config.json {line}; write it as {kind} (no quotes) or re-download the model's "
        "config.json")


def test_a_nested_rope_value_of_the_wrong_type_is_named(llama) -> None:
    rope = {**llama["rope_parameters"], "rope_theta": "500000"}
    assert hf_config.wrong_type({**llama, "rope_parameters": rope}).startswith(
        'config.json rope_parameters.rope_theta="500000" is a string, not a number;')


def test_values_transformers_writes_have_the_right_types(llama, mixtral) -> None:
    assert hf_config.wrong_type(llama) is None
    assert hf_config.wrong_type(mixtral) is None  # head_dim null: transformers derives it
    assert hf_config.wrong_type({**llama, "num_key_value_heads": None}) is None


class _Reads(dict):
    """A config.json that records the number and flag values a mapping reads (`a.b` inside an
    object), to hold them against what the family states it reads."""

    def __init__(self, values: dict, read: set, prefix: str = "") -> None:
        super().__init__(values)
        self.read, self.prefix = read, prefix

    def _seen(self, key: str, value: object) -> object:
        if isinstance(value, dict):
            return _Reads(value, self.read, f"{self.prefix}{key}.")
        if isinstance(value, int | float):  # bool too
            self.read.add(self.prefix + key)
        return value

    def __getitem__(self, key: str) -> object:
        return self._seen(key, super().__getitem__(key))

    def get(self, key: str, default: object = None) -> object:
        return self._seen(key, super().get(key, default)) if key in self else default


@pytest.mark.parametrize("kind, architecture", [
    ("llama", "LlamaForCausalLM"), ("mixtral", "MixtralForCausalLM"),
    ("nemotron_h", "NemotronHForCausalLM"), ("nemotron_super", "NemotronHForCausalLM")])
def test_every_number_a_family_reads_has_its_type_checked(kind, architecture) -> None:
    """What the type rule checks is what each family states beside its reading code
    (`HF_SCALARS`); a value read but not stated would reach `int()`/`float()` unchecked."""
    read: set[str] = set()
    config = config_json(kind, architecture)
    family = hf_config.ARCHITECTURES[architecture][1]
    family.hf_values(_Reads(config, read))
    assert read and read <= set(family.HF_SCALARS)
    assert read <= set(hf_config.SCALARS)


# 4. a size no model has
@pytest.mark.parametrize("key, value, least", [
    ("num_attention_heads", 0, 1), ("hidden_size", -64, 1), ("num_nextn_predict_layers", -1, 0)])
def test_an_impossible_size_is_a_broken_config_not_an_override(llama, key, value,
                                                               least) -> None:
    assert hf_config.impossible_size({**llama, key: value}) == (
        f"config.json {key}={value} is no model's size (at least {least}): the file is broken; "
        "re-download the model's config.json")


def test_possible_sizes_pass(llama) -> None:
    assert hf_config.impossible_size({**llama, "num_nextn_predict_layers": 0}) is None


def test_zero_heads_without_head_dim_is_one_line_not_a_division_by_zero(llama) -> None:
    config = {**llama, "num_attention_heads": 0, "head_dim": None}
    with pytest.raises(ConfigError, match="num_attention_heads=0 is no model's size"):
        hf_config.compare_with_recipe(config, get_recipe("hf_tiny_llama").model,
                                      "hf_tiny_llama")


# 5. a recipe of another architecture of the same family
def test_a_mixtral_recipe_for_a_llama_says_that_alone(llama) -> None:
    line = hf_config.other_architecture(llama, get_recipe("hf_tiny_mixtral").model,
                                        "hf_tiny_mixtral", "hf_tiny_llama")
    assert line == ("config.json's LlamaForCausalLM needs a llama recipe and "
                    "recipe=hf_tiny_mixtral is mixtral; import it with a llama recipe, e.g. "
                    "recipe=hf_tiny_llama")


def test_a_recipe_of_the_same_architecture_or_of_none_is_left_to_the_field_check(llama) -> None:
    for recipe in ("hf_tiny_llama", "tiny_dp1"):  # tiny_dp1: shaped as no architecture
        assert hf_config.other_architecture(llama, get_recipe(recipe).model, recipe, "x") is None


def test_compare_with_recipe_names_the_architecture_and_a_recipe_of_it(mixtral) -> None:
    with pytest.raises(ConfigError) as caught:
        hf_config.compare_with_recipe(mixtral, get_recipe("hf_tiny_llama").model,
                                      "hf_tiny_llama")
    assert str(caught.value) == (
        "config.json's MixtralForCausalLM needs a mixtral recipe and recipe=hf_tiny_llama is "
        "llama; import it with a mixtral recipe, e.g. recipe=hf_tiny_mixtral")


@pytest.mark.parametrize("change, recipe, line", [
    ({"hidden_size": "64"}, "hf_tiny_llama",
     'error: config.json hidden_size="64" is a string, not an integer;'),
    ({}, "hf_tiny_mixtral", "error: config.json's LlamaForCausalLM needs a llama recipe and "
                            "recipe=hf_tiny_mixtral is mixtral;"),
])
def test_the_script_prints_one_line_exits_2_and_writes_nothing(llama, tmp_path, change, recipe,
                                                               line) -> None:
    model = tmp_path / "hf"  # config.json alone: it is refused before any weight is looked at
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**llama, **change}))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}", f"out={out}",
         f"recipe={recipe}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(line), done.stderr
    assert not out.exists()

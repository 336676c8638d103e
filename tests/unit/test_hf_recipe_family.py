"""An import with a recipe of the other family (a hybrid recipe for a Llama folder, a GPT one
for a NemotronH) is one line saying what each is and naming a recipe of the folder's family,
the one whose model matches config.json field by field where there is one
(`trainer/interop/hf_config.py`: `other_family`, `example_recipe`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import config_json, make_hf_model
from trainer.interop import hf_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama() -> dict:
    return config_json("llama", "LlamaForCausalLM")


@pytest.fixture(scope="module")
def nemotron_h() -> dict:
    config = config_json("nemotron_h", "NemotronHForCausalLM")
    return {**config, "time_step_min": 0.0}


def test_a_hybrid_recipe_for_a_llama_names_a_llama_recipe(llama) -> None:
    model = get_recipe("hybrid_tiny_dp1").model
    assert hf_config.other_family(llama, model, "hybrid_tiny_dp1", "hf_tiny_llama") == (
        "recipe hybrid_tiny_dp1 is a hybrid model, not a GPT one: config.json's "
        "LlamaForCausalLM imports into GPT recipes only; import it with one, e.g. "
        "recipe=hf_tiny_llama (recipe=list shows them)")


def test_a_gpt_recipe_for_a_nemotron_h_names_a_hybrid_recipe(nemotron_h) -> None:
    model = get_recipe("hf_tiny_llama").model
    line = hf_config.other_family(nemotron_h, model, "hf_tiny_llama", "hf_tiny_nemotron_h")
    assert line.startswith("recipe hf_tiny_llama is a GPT model, not a hybrid one: config.json's "
                           "NemotronHForCausalLM imports into hybrid recipes only")
    assert line.endswith("e.g. recipe=hf_tiny_nemotron_h (recipe=list shows them)")


def test_a_recipe_of_the_same_family_is_left_to_the_familys_check(llama) -> None:
    assert hf_config.other_family(llama, get_recipe("tiny_dp1").model, "tiny_dp1", "x") is None


def test_the_example_is_the_recipe_that_matches_field_by_field(llama, nemotron_h) -> None:
    assert hf_config.example_recipe(llama) == "hf_tiny_llama"
    assert hf_config.example_recipe(nemotron_h) == "hf_tiny_nemotron_h"


def test_without_a_match_the_example_is_the_first_of_the_architecture(llama) -> None:
    assert hf_config.example_recipe({**llama, "hidden_size": 96}) == "llama3_8b_tp8_dp8"


def test_compare_with_recipe_raises_the_line(llama) -> None:
    with pytest.raises(ConfigError, match="e.g. recipe=hf_tiny_llama"):
        hf_config.compare_with_recipe(llama, get_recipe("hybrid_tiny_dp1").model,
                                      "hybrid_tiny_dp1")


def test_the_script_prints_one_line_exits_2_and_writes_nothing(tmp_path) -> None:
    model = make_hf_model("llama", tmp_path / "llama")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}", f"out={out}",
         "recipe=hybrid_tiny_dp1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("error: recipe hybrid_tiny_dp1 is a hybrid model, not a GPT "
                                  "one") and "e.g. recipe=hf_tiny_llama" in done.stderr
    assert not out.exists()

"""What a Hugging Face directory holds besides the tensors the mapping reads is checked before any
output exists (`trainer/interop/importer.py`, `check_source`; `trainer/interop/hf_files.py`): a
tensor no mapping rule uses (a layer more than config.json says, in a shard or in an index) and a
tensor stored as an integer dtype are one line each, not a checkpoint that drops or trains them;
the names transformers itself skips on load are skipped alike; a JSON side file that does not
parse is one line, not copied into the import and exported broken; a directory without any
tokenizer file imports with one note line saying so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import copy_model, hf_config, make_hf_model
from tests.unit.hf_tiny_import import OLD_BUFFER, run_import, with_tensors
from trainer.interop.hf_files import (
    JSON_SIDE_FILES,
    HFWeights,
    no_tokenizer_note,
    not_floating,
    not_json,
)
from trainer.interop.importer import (
    IGNORED_ON_LOAD,
    check_source,
    unused_line,
    unused_tensors,
)

SHARD = "model.safetensors"
EXTRA = "model.layers.4.mlp.up_proj.weight"  # the tiny Llama has num_hidden_layers=4


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama")


def _refusal(model: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        check_source(model, get_recipe("hf_tiny_llama"))
    assert "\n" not in str(caught.value)
    return str(caught.value)


# 1. tensors the mapping has no place for


def test_the_line_says_how_many_and_names_the_first_two() -> None:
    assert unused_line(Path("m"), "LlamaForCausalLM", ["a.weight"]) == (
        "hf=m holds 1 tensor that LlamaForCausalLM of config.json's sizes has no place for "
        "(a.weight); the weights do not match config.json: re-download the model")
    assert "holds 3 tensors that LlamaForCausalLM of config.json's sizes has no place for " \
        "(a, b, ...);" in unused_line(Path("m"), "LlamaForCausalLM", ["a", "b", "c"])


def test_what_transformers_skips_on_load_is_skipped() -> None:
    names = ["x", "model.rotary_emb.inv_freq", "model.layers.0.self_attn.rotary_emb.inv_freq"]
    assert unused_tensors(names, {"x"}, IGNORED_ON_LOAD["llama"]) == []
    assert unused_tensors(names, {"x"}, IGNORED_ON_LOAD["nemotron_h"]) == [  # it has no RoPE
        "model.layers.0.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"]
    assert unused_tensors(["mtp.layers.0.norm.weight"], {"x"}, IGNORED_ON_LOAD["nemotron_h"]) \
        == []


def test_an_mtp_tensor_is_refused_where_the_mapping_imports_mtp_depths() -> None:
    """transformers skips `mtp.*` because it builds no MTP head; a recipe with MTP depths
    imports them, so one more than config.json's depths is a mismatch, not a skip."""
    used = {"mtp.layers.0.norm.weight"}
    assert unused_tensors([*used, "mtp.layers.2.norm.weight"], used,
                          IGNORED_ON_LOAD["nemotron_h"]) == ["mtp.layers.2.norm.weight"]


@pytest.mark.parametrize("kind, family", [("llama", "llama"), ("mixtral", "mixtral"),
                                          ("nemotron_h", "nemotron_h")])
def test_the_skipped_names_are_those_of_the_installed_transformers(kind, family) -> None:
    """`_keys_to_ignore_on_load_unexpected`, plus `rotary_emb.inv_freq` for a model holding
    that buffer (modeling_utils.py, `_adjust_missing_and_unexpected_keys`)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(kind))
    theirs = set(type(model)._keys_to_ignore_on_load_unexpected or [])
    if any(name.endswith("rotary_emb.inv_freq") for name, _ in model.named_buffers()):
        theirs.add(r"rotary_emb\.inv_freq")
    assert not any(name.endswith("position_ids") for name, _ in model.named_buffers())
    assert set(IGNORED_ON_LOAD[family]) == theirs


def test_a_layer_more_in_the_shard_is_refused(llama, tmp_path) -> None:
    model = with_tensors(llama, tmp_path / "model",
                         model__layers__4__mlp__up_proj__weight=torch.zeros(128, 64))
    assert _refusal(model) == (
        f"hf={model} holds 1 tensor that LlamaForCausalLM of config.json's sizes has no place "
        f"for ({EXTRA}); the weights do not match config.json: re-download the model")


def test_a_tensor_named_only_by_the_index_is_refused(llama, tmp_path) -> None:
    model = copy_model(llama, tmp_path / "model")
    names = [*HFWeights(llama).weight_map, EXTRA, "model.layers.4.mlp.down_proj.weight"]
    index = {"weight_map": dict.fromkeys(names, SHARD)}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _refusal(model).startswith(
        f"hf={model} holds 2 tensors that LlamaForCausalLM of config.json's sizes has no place "
        f"for (model.layers.4.mlp.down_proj.weight, {EXTRA}); ")


def test_old_rotary_buffers_are_skipped_as_transformers_skips_them(llama, tmp_path) -> None:
    model = with_tensors(llama, tmp_path / "model",
                         model__rotary_emb__inv_freq=torch.ones(8),
                         model__layers__0__self_attn__rotary_emb__inv_freq=torch.ones(8))
    assert len(check_source(model, get_recipe("hf_tiny_llama")).plan) == 27


# 2. a weight stored as an integer dtype


def test_a_dtype_that_is_not_floating_point_is_named() -> None:
    assert not_floating("model.norm.weight", "I32") == (
        "hf tensor model.norm.weight is stored as I32, not a floating point dtype (F64, F32, "
        "BF16, F16, F8_E4M3, F8_E5M2); the weights are not the model's: re-download it")
    assert not_floating("model.norm.weight", "BF16") is None


def test_an_int32_weight_is_refused_from_the_header(llama, tmp_path) -> None:
    model = with_tensors(llama, tmp_path / "model",
                         model__norm__weight=torch.ones(64, dtype=torch.int32))
    assert _refusal(model).startswith("hf tensor model.norm.weight is stored as I32, not a "
                                      "floating point dtype (")


# 3. a JSON side file that does not parse


def test_a_json_side_file_that_does_not_parse_is_named(tmp_path) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text("{bad")
    assert not_json(path) == (f"{path} is not valid JSON (Expecting property name enclosed in "
                              "double quotes: line 1 column 2 (char 1)); re-download it")
    path.write_text("{}")
    assert not_json(path) is None
    binary = tmp_path / "tokenizer.model"
    binary.write_bytes(b"\xff\x00{")
    assert not_json(binary) is None


@pytest.mark.parametrize("name, text", [
    ("tokenizer.json", '{"version": "1.0", "trunc'), ("tokenizer_config.json", "{bad"),
    ("special_tokens_map.json", ""), ("generation_config.json", '{"bos_token_id": 1,,}'),
])
def test_a_damaged_json_side_file_is_refused_before_any_work(llama, tmp_path, name, text):
    assert name in JSON_SIDE_FILES
    model = copy_model(llama, tmp_path / "model")
    (model / name).write_text(text)
    line = _refusal(model)
    assert line.startswith(f"{model / name} is not valid JSON (")
    assert line.endswith("); re-download it")


# 4. no tokenizer file at all


def test_a_directory_without_tokenizer_files_gets_a_note(tmp_path) -> None:
    generation = tmp_path / "generation_config.json"
    assert no_tokenizer_note(tmp_path, [generation]) == (
        f"note: hf={tmp_path} has no tokenizer files; the import carries none (to keep the "
        "model's tokenizer, put its files beside config.json and import again)")
    assert no_tokenizer_note(tmp_path, [generation, tmp_path / "tokenizer.model"]) is None


def test_the_script_refuses_a_layer_more_in_one_line_and_writes_nothing(llama, tmp_path):
    model = with_tensors(llama, tmp_path / "model",
                         model__layers__4__mlp__up_proj__weight=torch.zeros(128, 64))
    out = tmp_path / "out"
    done = run_import(model, out)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(f"error: hf={model} holds 1 tensor that LlamaForCausalLM ")
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))


def test_the_script_imports_old_rotary_buffers_and_notes_no_tokenizer(tiny_llama_import):
    """The session's one import (tests/unit/conftest.py) is of a model holding the old buffer
    and no tokenizer file."""
    model, out, done = tiny_llama_import.model, tiny_llama_import.out, tiny_llama_import.done
    with safe_open(model / SHARD, "pt") as shard:
        assert OLD_BUFFER in shard.keys()
    assert done.returncode == 0, done.stderr[-2000:]
    note = re.escape(no_tokenizer_note(model, []))
    assert len(re.findall(f"^{note}$", done.stdout, re.MULTILINE)) == 1, done.stdout
    assert sorted(p.name for p in (out / "hf").iterdir()) == ["config.json",
                                                              "generation_config.json"]

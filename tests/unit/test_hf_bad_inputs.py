"""Bad inputs to scripts/convert.py end in one line naming what and how to fix, before any output
exists: not a Hugging Face model, an unmapped architecture, a recipe of another shape (each field
named), a missing shard or tensor, a tensor of the wrong shape, a bad command line. No process
group: everything here is refused from config.json and the shards' headers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import make_hf_model
from trainer.entry.commands import CONVERT
from trainer.entry.contract import parse_arguments
from trainer.interop import cli, hf_config
from trainer.interop.importer import check_source

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama")



def _parse(argv: list[str]) -> cli.Request:
    """scripts/convert.py's command line as the entry contract parses it."""
    args = parse_arguments(CONVERT, argv)
    return cli.make_request(args.rest, args.options)

def _copy(model: Path, to: Path) -> Path:
    to.mkdir()
    for path in model.iterdir():
        (to / path.name).write_bytes(path.read_bytes())
    return to


def _import_request(hf: Path, out: Path, *rest: str):
    return _parse(["import", f"hf={hf}", f"out={out}", *rest])


def test_directory_without_config_json_is_not_a_model(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is not a Hugging Face model: it has no config.json"):
        cli.import_config(_import_request(tmp_path, tmp_path / "out", "recipe=hf_tiny_llama"))


def test_unmapped_architecture_is_named(llama, tmp_path) -> None:
    model = _copy(llama, tmp_path / "gpt2")
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"architecture GPT2LMHeadModel is not mapped; "
                                          r"supported: LlamaForCausalLM, MixtralForCausalLM"):
        cli.import_config(_import_request(model, tmp_path / "out", "recipe=hf_tiny_llama"))


def test_recipe_of_another_shape_names_every_differing_field(llama, tmp_path) -> None:
    request = _import_request(llama, tmp_path / "out", "recipe=hf_tiny_llama",
                              "model.hidden_size=128", "model.num_query_groups=4")
    with pytest.raises(ConfigError) as caught:
        cli.import_config(request)
    message = str(caught.value)
    assert "hidden_size=64 but model.hidden_size=128" in message
    assert "num_key_value_heads=2 but model.num_query_groups=4" in message
    assert "override model.hidden_size=64 model.num_query_groups=2" in message
    assert "\n" not in message


def test_unmapped_rope_scaling_and_norm_epsilon_are_refused() -> None:
    llama = {"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "yarn",
                                                                     "factor": 4.0}}
    with pytest.raises(ConfigError, match="RoPE scaling .* is not mapped"):
        hf_config.rope_scaling_factor(llama)
    with pytest.raises(ConfigError, match="rms_norm_eps=1e-06 is not mapped"):
        hf_config.hf_values({**llama, "rms_norm_eps": 1e-6})


def test_missing_shard_is_named(llama, tmp_path) -> None:
    model = _copy(llama, tmp_path / "sharded")
    tensors = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    save_file({n: tensors[n] for n in halves["model-00001-of-00002.safetensors"]},
              model / "model-00001-of-00002.safetensors")
    index = {"weight_map": {n: shard for shard, group in halves.items() for n in group}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = get_recipe("hf_tiny_llama")
    with pytest.raises(ConfigError, match="shard model-00002-of-00002.safetensors named by "
                                          "model.safetensors.index.json is missing"):
        check_source(model, cfg)


def test_missing_tensor_and_wrong_shape_are_named(llama, tmp_path) -> None:
    cfg = get_recipe("hf_tiny_llama")
    for case, change in (("missing", None), ("shape", (2, 64))):
        model = _copy(llama, tmp_path / case)
        tensors = load_file(model / "model.safetensors")
        name = "model.layers.1.mlp.up_proj.weight"
        if change is None:
            del tensors[name]
        else:
            tensors[name] = tensors[name][: change[0]].contiguous()
        save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
        expected = f"lacks tensor {name}" if change is None else f"{name} has shape \\[2, 64\\]"
        with pytest.raises(ConfigError, match=expected):
            check_source(model, cfg)


@pytest.mark.parametrize("argv, expected", [
    ([], "convert needs a command, import or export"),
    (["export", "out=x"], "export needs checkpoint=DIR"),
    (["export", "checkpoint=a", "out=b", "recipe=x"], "export does not take 'recipe=x'"),
])
def test_command_line_mistakes(argv, expected) -> None:
    with pytest.raises(ConfigError, match=expected):
        _parse(argv)


def test_script_prints_one_line_exits_2_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={tmp_path}", f"out={out}",
         "recipe=hf_tiny_llama"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("error: hf=") and "no config.json" in done.stderr
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))


def test_config_json_missing_a_field_is_named() -> None:
    with pytest.raises(ConfigError, match="config.json lacks field num_attention_heads"):
        hf_config.hf_values({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})


def test_existing_output_is_refused_before_anything_runs(tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"out={tmp_path} already exists"):
        _parse(["export", "checkpoint=a", f"out={tmp_path}"])

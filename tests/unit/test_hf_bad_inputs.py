"""Bad inputs to scripts/convert.py end in one line naming what and how to fix, before any output
exists: not a Hugging Face model, an unmapped architecture, a recipe of another shape (each field
named), a missing shard or tensor, a tensor of the wrong shape, a bad command line, a NemotronH
feature our hybrid models cannot express. No process group: everything here is refused from
config.json and the shards' headers."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from tests.dist.hf_runs import copy_model, make_hf_model, nemotron_h_config
from tests.hang import HANG_S
from trainer.entry.commands import CONVERT
from trainer.entry.contract import parse_arguments
from trainer.interop import cli, hf_config
from trainer.interop.importer import check_source
from trainer.models.gpt import hf_config as llama_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama")



def _parse(argv: list[str]) -> cli.Request:
    """scripts/convert.py's command line as the entry contract parses it."""
    args = parse_arguments(CONVERT, argv)
    return cli.make_request(args.rest, args.options)

def _import_request(hf: Path, out: Path, *rest: str):
    return _parse(["import", f"hf={hf}", f"out={out}", *rest])


def test_directory_without_config_json_is_not_a_model(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is not a Hugging Face model: it has no config.json"):
        cli.import_config(_import_request(tmp_path, tmp_path / "out", "recipe=hf_tiny_llama"))


def test_unmapped_architecture_is_named(llama, tmp_path) -> None:
    model = copy_model(llama, tmp_path / "gpt2")
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
        llama_config.rope_scaling_factor(llama)
    with pytest.raises(ConfigError, match="rms_norm_eps=1e-06 is not mapped"):
        llama_config.hf_values({**llama, "rms_norm_eps": 1e-6})


def test_missing_shard_is_named(llama, tmp_path) -> None:
    model = copy_model(llama, tmp_path / "sharded")
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
        model = copy_model(llama, tmp_path / case)
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
    ([], "convert.py needs a command first: import or export"),
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
         "recipe=hf_tiny_llama"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("error: hf=") and "no config.json" in done.stderr
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))


def test_config_json_missing_a_field_is_named() -> None:
    with pytest.raises(ConfigError, match="config.json lacks field num_attention_heads"):
        llama_config.hf_values({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})


def test_existing_output_is_refused_before_anything_runs(tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"out={tmp_path} already exists"):
        _parse(["export", "checkpoint=a", f"out={tmp_path}"])


def test_export_of_a_megatron_fsdp_checkpoint_without_its_index_is_one_line(tmp_path) -> None:
    """An fsdp_dtensor step is exported (tests/dist/test_hf_interop.py); one whose DCP index is
    lost is named in one line, before any output exists."""
    from rich.progress import Progress

    from recipes.config.io import save_config
    from trainer.interop.exporter import export_hf

    step = tmp_path / "run" / "checkpoints" / "iter_0000002"
    step.mkdir(parents=True)
    (step / "metadata.json").write_text('{"sharded_backend": "fsdp_dtensor"}')
    save_config(get_recipe("hf_tiny_llama"), tmp_path / "run" / "config.yaml")
    out = tmp_path / "out"
    with Progress(disable=True) as progress, pytest.raises(
            ConfigError, match=r"iter_0000002/.metadata cannot be read \(cut short or "
                               r"damaged\)") as error:
        export_hf(step.parent, out, progress)
    assert "\n" not in str(error.value)
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))


@pytest.fixture(scope="module")
def nemotron_h() -> dict:
    """The tiny NemotronH's config.json as transformers writes it (recipe hf_tiny_nemotron_h)."""
    config = nemotron_h_config()
    config.time_step_min = 0.0
    return {**json.loads(config.to_json_string()), "architectures": ["NemotronHForCausalLM"]}


NEMOTRON_H_REFUSED = [
    ({"n_group": 2, "topk_group": 1}, {},
     "n_group=2 topk_group=1 (group-limited routing) is not mapped"),
    ({"norm_topk_prob": False}, {},
     "norm_topk_prob=false with num_experts_per_tok=2 is not mapped"),
    ({"moe_latent_size": 16}, {}, "moe_latent_size=16 but model.moe_latent_size=null"),
    ({"num_nextn_predict_layers": 1}, {},
     "num_nextn_predict_layers=1 of layers '*E' but the recipe's pattern stores 0 MTP depth(s) "
     "of '' (0 run); pick a recipe of this shape or override model.hybrid_layer_pattern=M*-E/*E"),
    ({"num_nextn_predict_layers": 1, "mtp_layers_block_type": ["full_attention", "swa"]}, {},
     "config.json mtp_layers_block_type block type swa is not mapped"),
    ({"mlp_hidden_act": "gelu"}, {}, "mlp_hidden_act=gelu is not mapped"),
    ({"mamba_hidden_act": "relu"}, {}, "mamba_hidden_act=relu is not mapped"),
    ({"use_conv_bias": False}, {}, "use_conv_bias=false is not mapped"),
    ({"time_step_limit": [0.0, 0.1]}, {}, "time_step_limit=[0.0, 0.1] is not mapped"),
    ({"residual_in_fp32": True}, {}, "residual_in_fp32=true is not mapped"),
    ({"sliding_window": 16}, {}, "sliding_window=16 is not mapped"),
    ({"layer_norm_epsilon": 1e-6}, {}, "layer_norm_epsilon=1e-06 is not mapped"),
    ({"use_bias": True}, {}, "biases (use_bias, mlp_bias or attention_bias true)"),
    ({"layers_block_type": ["linear_attention", "indexed_attention", "mlp", "moe"]}, {},
     "block type indexed_attention is not mapped"),
    ({"ssm_state_size": None}, {}, "config.json lacks field ssm_state_size"),
    ({"layers_block_type": ["moe", "linear_attention", "full_attention", "mlp"]}, {},
     "layers_block_type=EM*- but model.hybrid_layer_pattern=M*-E"),
    ({"moe_shared_expert_intermediate_size": 64, "routed_scaling_factor": 1.0}, {},
     "moe_shared_expert_intermediate_size=64 but model.moe_shared_expert_ffn_hidden_size=48; "
     "routed_scaling_factor=1 but model.moe_router_topk_scaling_factor=2.5"),
    ({}, {"moe_router_expert_bias": False},
     "gate.e_score_correction_bias=true but model.moe_router_expert_bias=false"),
    ({}, {"hybrid_layer_pattern": None}, "recipe hf_tiny_nemotron_h is a GPT model, not a hybrid"),
    ({}, {"activation": "swiglu"}, "is not NemotronH-shaped (model.activation=swiglu)"),
]


@pytest.mark.parametrize("change, ours, expected", NEMOTRON_H_REFUSED)
def test_nemotron_h_features_we_cannot_express_are_refused(
    nemotron_h, change, ours, expected
) -> None:
    """`change` to the tiny model's config.json (None: the field is absent), `ours` to the
    recipe's model; what `convert.py import` checks first (cli.import_config)."""
    config = {name: value for name, value in {**nemotron_h, **change}.items() if value is not None}
    model = dataclasses.replace(get_recipe("hf_tiny_nemotron_h").model, **ours)
    with pytest.raises(ConfigError, match=re.escape(expected)) as caught:
        hf_config.compare_with_recipe(config, model, "hf_tiny_nemotron_h")
    assert "\n" not in str(caught.value)


def test_nemotron_h_refusal_is_one_line_and_exit_2_from_the_script(nemotron_h, tmp_path) -> None:
    model = tmp_path / "hf"  # config.json alone: it is refused before any weight is looked at
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**nemotron_h, "n_group": 2}))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/convert.py", "import", f"hf={model}", f"out={out}",
         "recipe=hf_tiny_nemotron_h"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("error: config.json n_group=2 topk_group=1")
    assert not out.exists()

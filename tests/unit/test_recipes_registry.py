"""Every registered recipe: its name matches its layout, it validates, and it survives YAML."""

from __future__ import annotations

import re

import pytest

from plugins.protocol.errors import ConfigError
from recipes import llama3, mixtral
from recipes.config.io import load_config, save_config
from recipes.config.schema import ModelConfig, RunConfig
from recipes.config.validation import validate
from recipes.nemotron import nemotron4
from recipes.registry import (
    ALIASES,
    DEFAULT_RECIPE,
    RECIPES,
    canonical_name,
    format_recipe_list,
    get_recipe,
    recipe_description,
    recipe_names,
)

SIZE_TOKEN = re.compile(r"(tp|pp|cp|ep|vpp|dp)(\d+)")


def name_sizes(name: str) -> dict[str, int]:
    """Parallel sizes spelled in a recipe name: 'llama3_8b_tp8_pp4_dp2' -> tp 8, pp 4, dp 2."""
    sizes = {}
    for token in name.split("_"):
        match = SIZE_TOKEN.fullmatch(token)
        if match:
            sizes[match.group(1)] = int(match.group(2))
    return sizes


def config_sizes(cfg: RunConfig) -> dict[str, int]:
    p = cfg.parallel
    return {
        "tp": p.tensor,
        "pp": p.pipeline,
        "cp": p.context,
        "ep": p.expert,
        "vpp": p.virtual_pipeline or 1,
        "dp": cfg.layout.data_parallel,
    }


@pytest.mark.parametrize("name", recipe_names())
def test_name_states_every_parallel_size(name: str) -> None:
    # A size missing from the name must be 1: 'tiny_tp2' is TP2 x DP1, not TP2 x DP2.
    spelled = name_sizes(name)
    actual = config_sizes(get_recipe(name))
    expected = {key: spelled.get(key, 1) for key in actual}
    assert actual == expected


@pytest.mark.parametrize("name", recipe_names())
def test_name_flags_match_config(name: str) -> None:
    cfg = get_recipe(name)
    tokens = set(name.split("_"))
    flags = {
        "sp": cfg.parallel.sequence_parallel,
        "distopt": cfg.optimizer.distributed,
        "overlap": cfg.optimizer.overlap_grad_reduce,
        "recompute": cfg.train.recompute != "none",
        "fsdp": cfg.optimizer.fsdp != "none",
        "offload": cfg.optimizer.cpu_offload,
        "bf16": cfg.precision.dtype == "bf16",
    }
    # 'overlap' in a tiny name means the overlapped distributed-optimizer path; Megatron FSDP
    # and optimizer offload run on the distributed optimizer.
    implied = {"distopt"} if tokens & {"overlap", "fsdp", "offload"} else set()
    for token, enabled in flags.items():
        if token in tokens:
            assert enabled, f"{name} says {token} but the config has it off"
        elif name.startswith("tiny_") and token not in implied:
            # Tiny layouts are the equivalence-test layouts: nothing on that the name hides.
            assert not enabled, f"{name} has {token} on without saying so"


@pytest.mark.parametrize("name", list(RECIPES))  # aliases repeat these
def test_recipe_validates(name: str) -> None:
    validate(get_recipe(name))


@pytest.mark.parametrize("name", list(RECIPES))  # aliases repeat these
def test_recipe_yaml_round_trip_is_identical(name: str, tmp_path) -> None:
    cfg = get_recipe(name)
    reloaded = load_config(save_config(cfg, tmp_path / "config.yaml"))
    assert type(reloaded.model) is ModelConfig
    assert reloaded == cfg


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_is_registered_under_its_function_name(name: str) -> None:
    assert RECIPES[name].__name__ == name
    assert get_recipe(name).name == name
    assert recipe_description(name)


def test_aliases_point_to_config_a_and_b() -> None:
    assert canonical_name("8b_tp8_dp8") == "llama3_8b_tp8_dp8"
    assert canonical_name("8b_tp8_pp4_dp2") == "llama3_8b_tp8_pp4_dp2"
    assert get_recipe("8b_tp8_pp4_dp2") == get_recipe("llama3_8b_tp8_pp4_dp2")
    assert set(ALIASES.values()) <= set(RECIPES)


def test_default_recipe_is_the_tiny_tp2_pp2_model_on_prepared_stdlib() -> None:
    cfg = get_recipe(DEFAULT_RECIPE)
    assert DEFAULT_RECIPE == "stdlib_bpe_tp2_pp2"
    assert cfg.cluster.world_size == 4
    assert (cfg.model.vocab_size, cfg.data.source, cfg.precision.dtype) == (2048, "blend", "fp32")
    assert cfg.data.blend == "conf/data/python_stdlib.yaml"
    assert cfg.parallel == get_recipe("tiny_tp2_pp2").parallel


def test_get_recipe_returns_a_fresh_config() -> None:
    first = get_recipe("tiny_dp1")
    first.model.hidden_size = 999
    assert get_recipe("tiny_dp1").model.hidden_size != 999


def test_unknown_recipe_names_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown recipe '8b_tp8_pp2_dp2'; did you mean 8b_tp8_"):
        get_recipe("8b_tp8_pp2_dp2")


def test_recipe_list_shows_every_recipe_with_its_description() -> None:
    text = format_recipe_list()
    for name in RECIPES:
        line = next(line for line in text.splitlines() if line.split()[0] == name)
        assert recipe_description(name) in line
    assert "alias 8b_tp8_pp4_dp2" in text


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_description_is_a_whole_sentence(name: str) -> None:
    """The list shows a docstring's first paragraph, not a first line cut mid-sentence."""
    description = recipe_description(name)
    assert description.endswith("."), description
    assert "\n" not in description and "  " not in description


def test_tiny_layouts_train_the_same_model_on_the_same_batch() -> None:
    tiny = [name for name in RECIPES if name.startswith("tiny_")]
    reference = get_recipe("tiny_dp1")
    for name in tiny:
        cfg = get_recipe(name)
        assert cfg.model == reference.model, name
        assert cfg.layout.padded_vocab == reference.layout.padded_vocab, name
        assert cfg.train.global_batch_size == 8 and cfg.train.micro_batch_size == 2, name
        assert (cfg.data, cfg.scheduler) == (reference.data, reference.scheduler), name
        # the precision too, unless the name says otherwise (offload trains bf16 weights)
        assert cfg.precision == reference.precision or "bf16" in name.split("_"), name
    assert reference.layout.microbatches == 4


def test_large_recipes_use_64_gpus() -> None:
    """Configurations A and B and the other 64-GPU recipes use the 8 x 8 cluster (the Llama
    3.1 405B ones are larger)."""
    large = {name: cfg for name, cfg in ((name, get_recipe(name)) for name in RECIPES)
             if 16 < cfg.cluster.world_size <= 64}
    # 18 today (A and B among them); a filter that matched none would check nothing.
    assert {"llama3_8b_tp8_dp8", "llama3_8b_tp8_pp4_dp2"} <= set(large) and len(large) >= 18
    for name, cfg in large.items():
        assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node) == (8, 8), name
        assert cfg.precision.dtype == "bf16" and cfg.optimizer.distributed, name


def test_llama3_70b_interleaves_four_layers_per_chunk() -> None:
    cfg = get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2")
    assert cfg.layout.layers_per_chunk == 4


def approx_parameters(model: ModelConfig) -> int:
    """Parameters of a GPT of this shape (norm weights ignored: they are < 0.01%)."""
    head_dim = model.kv_channels or model.hidden_size // model.num_attention_heads
    groups = model.num_query_groups or model.num_attention_heads
    h = model.hidden_size
    attention = h * head_dim * (model.num_attention_heads * 2 + groups * 2)
    mlp_mats = 3 if model.activation == "swiglu" else 2
    expert = mlp_mats * h * (model.moe_ffn_hidden_size or model.ffn_hidden_size)
    experts = model.num_moe_experts or 1
    router = h * experts if model.num_moe_experts else 0
    embeddings = model.vocab_size * h * (1 if model.share_embeddings_and_output_weights else 2)
    return model.num_layers * (attention + expert * experts + router) + embeddings


@pytest.mark.parametrize(
    ("model_fn", "published"),
    [
        (llama3.llama3_8b_model, 8.03e9),
        (llama3.llama3_70b_model, 70.55e9),
        (nemotron4.nemotron4_15b_model, 15.6e9),
        (mixtral.mixtral_8x7b_model, 46.7e9),
    ],
)
def test_model_shapes_give_the_published_sizes(model_fn, published: float) -> None:
    assert approx_parameters(model_fn()) == pytest.approx(published, rel=0.01)



@pytest.mark.parametrize("name", [n for n in RECIPES if get_recipe(n).cluster.nodes > 1])
def test_recipes_beyond_one_node_are_safe_to_launch(name) -> None:
    """A node failure or a requeue loses at most a save interval (and a damaged newest
    checkpoint has one before it); the built-in corpus is refused before launch."""
    from recipes.config.path_rules import check_real_data_beyond_one_node

    cfg = get_recipe(name)
    assert 0 < cfg.checkpoint.save_interval <= cfg.train.train_iters // 20
    assert cfg.checkpoint.save and cfg.checkpoint.keep_last and cfg.checkpoint.keep_last >= 2
    if cfg.data.source == "blend":  # a recipe in phases names its (example) blends itself
        assert check_real_data_beyond_one_node(cfg) is None
        return
    refusal = check_real_data_beyond_one_node(cfg)
    assert refusal and "data.source=blend data.blend=conf/data/<blend>.yaml" in refusal
    cfg.data.source, cfg.data.blend = "blend", "conf/data/python_stdlib.yaml"
    assert check_real_data_beyond_one_node(cfg) is None

"""`a.b=c` overrides: values land typed in the dataclass; mistakes are one line with the fix."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import (
    apply_overrides,
    closest_keys,
    config_keys,
    describe_type,
    field_type,
)
from recipes.config.schema import ModelConfig, RunConfig
from recipes.registry import get_recipe


def test_overrides_are_typed_and_nested_dataclasses_survive() -> None:
    cfg = apply_overrides(
        get_recipe("tiny_dp1"),
        [
            "train.micro_batch_size=4",
            "optimizer.lr=2e-4",
            "parallel.virtual_pipeline=2",
            "model.num_query_groups=null",
            "plugins.fp8.format=hybrid",
            "dry_run=true",
        ],
    )
    assert isinstance(cfg, RunConfig) and isinstance(cfg.model, ModelConfig)
    assert cfg.train.micro_batch_size == 4
    assert cfg.optimizer.lr == pytest.approx(2e-4) and isinstance(cfg.optimizer.lr, float)
    assert cfg.parallel.virtual_pipeline == 2
    assert cfg.model.num_query_groups is None
    assert cfg.plugins.fp8.format == "hybrid"
    assert cfg.dry_run is True


def test_boolean_fields_still_take_yaml_booleans() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["checkpoint.save=off", "dry_run=yes"])
    assert cfg.checkpoint.save is False and cfg.dry_run is True


def test_later_override_wins_and_input_is_not_mutated() -> None:
    base = get_recipe("tiny_dp1")
    cfg = apply_overrides(base, ["train.train_iters=5", "train.train_iters=7"])
    assert cfg.train.train_iters == 7
    assert base.train.train_iters == get_recipe("tiny_dp1").train.train_iters != 7


def test_no_overrides_gives_an_equal_config() -> None:
    base = get_recipe("tiny_tp2_pp2")
    assert apply_overrides(base, []) == base


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.lr=1e-4", "unknown config key 'train.lr'; did you mean optimizer.lr"),
        ("model.hiden_size=32", "unknown config key 'model.hiden_size'; did you mean "
         "model.hidden_size"),
        ("modle.hidden_size=32", "there is no section 'modle' (nearest: model); did you mean "
         "model.hidden_size?"),
        ("parallel.tp=2", "unknown config key 'parallel.tp'; did you mean parallel.tensor"),
        ("gbs=16", "unknown config key 'gbs'; did you mean train.global_batch_size"),
        ("dp=2", "'dp' cannot be set; data parallel size is derived as cluster.nodes x "
         "cluster.gpus_per_node / (TP x PP x CP)"),
        ("zzz.qqq=1", "there is no section 'zzz'; the sections are model, parallel, cluster, "
         "train, optimizer, scheduler, precision, data, checkpoint, logging, "
         "plugins.fp8, plugins.context_parallel, plugins.moe"),
        ("plugins.fp9.format=hybrid", "there is no section 'plugins.fp9' (nearest: plugins.fp8"),
        ("fp8.format=hybrid", "there is no section 'fp8' (nearest: plugins.fp8); did you mean "
         "plugins.fp8.format?"),
        ("foo.hidden_size=8", "there is no section 'foo'; did you mean model.hidden_size?"),
        ("modle=3", "unknown config key 'modle'; did you mean the section model?"),
        ("logging.zzz=1", "unknown config key 'logging.zzz'; section logging has log_interval, "
         "progress_bar, exposed_comm"),
        ("plugins.fp8.fromat=hybrid", "unknown config key 'plugins.fp8.fromat'; did you mean "
         "plugins.fp8.format"),
    ],
)
def test_unknown_key_names_the_closest_valid_keys(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [override])
    assert str(caught.value).startswith(f"override '{override}': {message}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.micro_batch_size=abc",
         "train.micro_batch_size expects an integer, got 'abc' (currently "
         "train.micro_batch_size=2)"),
        ("model.num_layers=2.5", "model.num_layers expects an integer, got '2.5'"),
        ("model.num_layers=null", "model.num_layers expects an integer, got 'null'"),
        ("optimizer.lr=fast", "optimizer.lr expects a number, got 'fast'"),
        ("model.activation=relu",
         "model.activation expects one of gelu, swiglu, squared_relu, got 'relu' (currently "
         "model.activation=gelu)"),
        ("plugins.fp8.format=e5m2",
         "plugins.fp8.format expects one of hybrid, e4m3, e2m1 or null, got 'e5m2'"),
        ("model.num_query_groups=many",
         "model.num_query_groups expects an integer or null, got 'many' (currently "
         "model.num_query_groups=null)"),
        ("parallel.sequence_parallel=maybe",
         "parallel.sequence_parallel expects true or false, got 'maybe' (currently "
         "parallel.sequence_parallel=false)"),
        # OmegaConf takes any integer for true; the type says true or false (1 and 0 are).
        ("parallel.sequence_parallel=2",
         "parallel.sequence_parallel expects true or false, got '2' (currently "
         "parallel.sequence_parallel=false)"),
        ("optimizer.overlap_grad_reduce=-7", "optimizer.overlap_grad_reduce expects true or "
         "false, got '-7'"),
        ("model=3", "'model' is a section, not a value; set one of its fields, "
         "e.g. model.num_layers=..."),
        ("plugins.fp8=3", "'plugins.fp8' is a section, not a value; set one of its fields, "
         "e.g. plugins.fp8.format=..."),
        ("model.hidden_size.x=3", "model.hidden_size is a value, not a section; set it "
         "directly, e.g. model.hidden_size=64"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [override])
    assert str(caught.value).startswith(f"override '{override}': {message}")


def test_one_and_zero_are_true_and_false() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["parallel.sequence_parallel=1",
                                                   "optimizer.overlap_grad_reduce=0"])
    assert cfg.parallel.sequence_parallel is True and cfg.optimizer.overlap_grad_reduce is False


PHASES_EXAMPLE = "phases=[{name: general, tokens: 0.8}, {name: quality, tokens: 0.2}]"
PHASE_ELEMENT = ("a phase, a mapping of its fields (name, tokens, end_step, blend, "
                 "global_batch_size, seq_length, context, documents, micro_batch_size, lr_decay, "
                 "relaunch)")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # a mapping for a list: OmegaConf's TypeError "Cannot merge incompatible container types"
        ("phases={}", f"phases is a list; write e.g. {PHASES_EXAMPLE}"),
        ("train.recompute_modules={}",
         "train.recompute_modules is a list; write e.g. train.recompute_modules=[core_attn]"),
        ("train.offload_modules={a: 1}",
         "train.offload_modules is a list; write e.g. train.offload_modules=[core_attn]"),
        ("train.rampup_batch_size={}",
         "train.rampup_batch_size is a list; write e.g. train.rampup_batch_size=[32,32,1000]"),
        ("plugins.context_parallel.hierarchical_sizes={}",
         "plugins.context_parallel.hierarchical_sizes is a list; write e.g. "
         "plugins.context_parallel.hierarchical_sizes=[2,2]"),
        # an element of the wrong shape or type: the element type and a whole list as example
        ("train.rampup_batch_size=[[1],2,3]",
         "train.rampup_batch_size[0] expects an integer, got '[1]'; write e.g. "
         "train.rampup_batch_size=[32,32,1000]"),
        ("train.rampup_batch_size=[a,b,c]",
         "train.rampup_batch_size[0] expects an integer, got 'a'; write e.g. "
         "train.rampup_batch_size=[32,32,1000]"),
        ("train.rampup_batch_size=[32,2.5,100]",
         "train.rampup_batch_size[1] expects an integer, got '2.5'; write e.g. "
         "train.rampup_batch_size=[32,32,1000]"),
        ("train.recompute_modules=[[core_attn]]",
         "train.recompute_modules[0] expects a string, got '[core_attn]'; write e.g. "
         "train.recompute_modules=[core_attn]"),
        ("phases=[1]", f"phases[0] expects {PHASE_ELEMENT}, got '1'; write e.g. {PHASES_EXAMPLE}"),
        ("phases=[null]", f"phases[0] expects {PHASE_ELEMENT}, got 'null'"),
        # the value as typed, not as YAML read it
        ("train.train_iters=1e3",
         "train.train_iters expects an integer, got '1e3' (currently train.train_iters=300)"),
    ],
)
def test_list_fields_and_their_elements_name_the_form(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [override])
    assert str(caught.value).startswith(f"override '{override}': {message}")
    assert "\n" not in str(caught.value) and "currently phases" not in str(caught.value)
    assert "[0]=null" not in str(caught.value)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--train.lr=1", "'--train.lr=1' is not an override; write KEY=VALUE without dashes"),
        ("train.micro_batch_size", "is not an override; write KEY=VALUE"),
        ("=3", "is not an override; write KEY=VALUE"),
        ("model.hidden_size=[1,", "cannot parse the value '[1,'"),
        ("model..hidden_size=3", "the key 'model..hidden_size' has an empty part between dots"),
    ],
)
def test_malformed_arguments_say_the_form(argument: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [argument])
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.lr=", "optimizer.lr is empty; give it a value, e.g. optimizer.lr=0.003"),
        ("output_dir=", "output_dir is empty; give it a value, e.g. output_dir=runs"),
        ("checkpoint.load=", "checkpoint.load is empty; give it a value (a string), or "
         "checkpoint.load=null to leave it unset"),
        ("model.kv_channels= ", "model.kv_channels is empty; give it a value (an integer), or "
         "model.kv_channels=null to leave it unset"),
        ("train.recompute=", "train.recompute is empty; give it a value, e.g. "
         "train.recompute=none"),
    ],
)
def test_empty_value_says_what_to_give(override: str, message: str) -> None:
    # OmegaConf reads `key=` as null: accepted silently for nullable fields without this check.
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [override])
    assert str(caught.value) == f"override '{override}': {message}"


def test_empty_value_suggests_the_current_value_of_a_nullable_field() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["model.num_query_groups=2"])
    with pytest.raises(ConfigError) as caught:
        apply_overrides(cfg, ["model.num_query_groups="])
    assert "e.g. model.num_query_groups=2, or model.num_query_groups=null" in str(caught.value)


def test_non_finite_numbers_parse_and_are_left_to_validation() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["optimizer.lr=nan", "optimizer.adam_eps=inf"])
    assert cfg.optimizer.lr != cfg.optimizer.lr and cfg.optimizer.adam_eps == float("inf")


def test_config_keys_cover_nested_sections() -> None:
    keys = config_keys()
    assert "plugins.fp8.format" in keys and "cluster.threads_per_rank" in keys
    assert "model.hidden_size" in keys and "model" not in keys
    assert len(keys) == len(set(keys))


def test_closest_keys_prefer_the_same_field_name() -> None:
    assert closest_keys("train.lr")[0] == "optimizer.lr"
    assert closest_keys("train.microbatch_size")[0] == "train.micro_batch_size"


def test_closest_keys_prefer_the_typed_section() -> None:
    assert closest_keys("model.hiden_size")[0] == "model.hidden_size"
    assert closest_keys("parallel.tp")[0] == "parallel.tensor"


def test_describe_type_of_schema_fields() -> None:
    assert describe_type(field_type("model.kv_channels")) == "an integer or null"
    assert describe_type(field_type("checkpoint.load")) == "a string or null"
    assert describe_type(field_type("data.tokenizer")) == "one of byte"
    assert field_type("model.nope") is None


def test_every_retired_key_is_gone_from_the_schema_and_refused_in_one_line() -> None:
    from recipes.config.overrides import retired_keys

    assert set(retired_keys()) >= {"plugins.packing.enabled", "plugins.moe.enabled",
                                   "plugins.cpu_runtime.enabled", "logging.metrics_file"}
    for key, retired in retired_keys().items():
        assert key not in config_keys(), key  # a live key must not be refused
        with pytest.raises(ConfigError) as caught:
            apply_overrides(get_recipe("tiny_dp1"), [f"{key}=true"])
        assert str(caught.value) == f"override '{key}=true': {key} was {retired.instead}"
        for new in retired.carries("on"):
            assert new in config_keys(), (key, new)  # a moved value lands on a live key


def test_a_moved_key_is_one_table_line_even_where_its_section_is_gone(monkeypatch,
                                                                       tmp_path) -> None:
    """The table is general: a key whose whole section went is named as moved, not as a
    missing section; in a saved file too."""
    from recipes.config.io import load_config
    from recipes.config.overrides import RETIRED_KEYS, Retired

    moved = {"plugins.gone.enabled": Retired("moved to cluster.gpus_per_node; set that instead",
                                             lambda value: {"cluster.gpus_per_node": value})}
    monkeypatch.setattr("recipes.config.overrides.RETIRED_KEYS", {**RETIRED_KEYS, **moved})
    with pytest.raises(ConfigError, match=r"^override 'plugins.gone.enabled=on': "
                       r"plugins.gone.enabled was moved to cluster.gpus_per_node; set that "
                       r"instead$"):
        apply_overrides(get_recipe("tiny_dp1"), ["plugins.gone.enabled=on"])
    saved = tmp_path / "config.yaml"
    saved.write_text("name: old\nplugins:\n  gone:\n    enabled: 2\n")
    assert load_config(saved).cluster.gpus_per_node == 2


def test_a_saved_config_with_the_retired_metrics_switch_still_loads(tmp_path) -> None:
    """Every run wrote `logging.metrics_file: true` into its config.yaml while the switch
    existed (it was never read): such a file loads, the key dropped."""
    from recipes.config.io import load_config

    saved = tmp_path / "config.yaml"
    saved.write_text("name: old\nlogging:\n  log_interval: 5\n  metrics_file: true\n")
    assert load_config(saved).logging.log_interval == 5

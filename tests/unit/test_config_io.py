"""Resolved configs saved as YAML reload to an identical dataclass; broken files are one line."""

from __future__ import annotations

import math

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import config_to_yaml, load_config, save_config
from recipes.config.overrides import apply_overrides
from recipes.config.schema import RunConfig
from recipes.config.yaml_file import scalar_texts
from recipes.registry import get_recipe


def test_round_trip_keeps_overridden_values(tmp_path) -> None:
    cfg = apply_overrides(
        get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2"),
        ["optimizer.lr=2e-4", "checkpoint.load=/ckpt/x", "model.num_query_groups=null"],
    )
    path = save_config(cfg, tmp_path / "run" / "config.yaml")
    reloaded = load_config(path)
    assert reloaded == cfg
    assert reloaded.checkpoint.load == "/ckpt/x" and reloaded.model.num_query_groups is None


def test_saved_file_says_how_to_reproduce(tmp_path) -> None:
    path = save_config(get_recipe("tiny_dp2"), tmp_path / "config.yaml")
    text = path.read_text()
    assert text.startswith("# Resolved configuration of recipe 'tiny_dp2'.")
    assert f"python scripts/pretrain.py config={path}" in text
    assert "  global_batch_size: 8\n" in text


def test_missing_keys_take_schema_defaults(tmp_path) -> None:
    path = tmp_path / "partial.yaml"
    path.write_text("name: partial\nmodel:\n  num_layers: 8\n")
    cfg = load_config(path)
    expected = RunConfig(name="partial")
    expected.model.num_layers = 8
    assert cfg == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  hidn_size: 3\n",
         "unknown config key 'model.hidn_size'; did you mean model.hidden_size"),
        ("train:\n  micro_batch_size: two\n",
         "train.micro_batch_size expects an integer, got 'two'"),
        ("model: [\n", "is not valid YAML at line 2; fix or re-save it"),
        ("- 1\n- 2\n", "must hold a mapping of config sections, not a list"),
        # the value as the file writes it, not as YAML read it
        ("cluster:\n  device: off\n",
         "cluster.device expects one of auto, gpu, cpu, got 'off' (default "
         "cluster.device=auto)"),
        ("train:\n  train_iters: 1e3\n", "train.train_iters expects an integer, got '1e3'"),
        ("phases: {}\n", "phases is a list; write e.g. phases: [{name: general, tokens: 0.8}, "
         "{name: quality, tokens: 0.2}]"),
        ("train:\n  rampup_batch_size: {}\n", "train.rampup_batch_size is a list; write e.g. "
         "train.rampup_batch_size: [32,32,1000]"),
        ("phases: [7]\n", "phases[0] expects a phase, a mapping of its fields (name, tokens, "),
    ],
)
def test_broken_file_is_one_line_naming_the_file(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"config file {path}")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_file_says_what_to_pass(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist; pass a saved config, e\.g\. config="):
        load_config(tmp_path / "nope.yaml")


def test_run_directory_points_at_its_config_file(tmp_path) -> None:
    save_config(get_recipe("tiny_dp1"), tmp_path / "config.yaml")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value) == (
        f"config file {tmp_path} is a directory, not a file; pass the file, "
        f"e.g. config={tmp_path / 'config.yaml'}"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "is empty; pass a saved config with its sections"),
     ("# nothing\n", "is empty; pass a saved config with its sections"),
     ("modle:\n  hidden_size: 8\n  num_layers: 2\n",
      "there is no section 'modle' (nearest: model); did you mean model.hidden_size?"),
     ("optimizer:\n  lr: .nan\n", None)],
)
def test_empty_files_and_unknown_sections(tmp_path, text: str, message: str | None) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    if message is None:  # non-finite values load; validation refuses them
        assert math.isnan(load_config(path).optimizer.lr)
        return
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_empty_config_argument_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^config= is empty; give it a saved config"):
        load_config("")


def test_yaml_text_matches_saved_body(tmp_path) -> None:
    cfg = get_recipe("mixtral_8x7b_tp1_pp4_ep8_dp16")
    path = save_config(cfg, tmp_path / "config.yaml")
    assert path.read_text().endswith(config_to_yaml(cfg))


@pytest.mark.parametrize(("old", "carried"), [
    ("  packing:\n    enabled: false\n  moe:\n    enabled: true\n    per_expert: true\n", []),
    ("  cpu_runtime:\n    enabled: auto\n    threads_per_rank: 1\n", []),
    ("  cpu_runtime:\n    enabled: 'on'\n    threads_per_rank: 2\n",
     ["cluster.device=cpu", "cluster.threads_per_rank=2"]),
    ("  cpu_runtime:\n    enabled: off\n", ["cluster.device=gpu"]),
])
def test_an_old_saved_config_carries_its_moved_keys_over(tmp_path, old, carried) -> None:
    """Saved configs hold every field, so one written before a key moved or a switch became
    implied still holds it: a run's own config.yaml loads, the moved values in their new
    places (an override that sets a retired key is refused instead: tests/unit/
    test_overrides.py)."""
    path = save_config(get_recipe("tiny_dp1"), tmp_path / "config.yaml")
    text = path.read_text()
    assert "  packing: {}\n" in text and "  moe:\n    per_expert: true\n" in text
    text = text.replace("  packing: {}\n", "").replace("  moe:\n    per_expert: true\n", "")
    path.write_text(text.replace("plugins:\n", "plugins:\n" + old))
    assert load_config(path) == apply_overrides(get_recipe("tiny_dp1"), carried)


def test_scalar_texts_keep_what_the_file_writes() -> None:
    text = "train:\n  train_iters: 1e3\n  lr: '3e-4'\nphases:\n  - name: a\n    tokens: 0.5\n"
    assert scalar_texts(text) == {"train.train_iters": "1e3", "train.lr": "3e-4",
                                  "phases[0].name": "a", "phases[0].tokens": "0.5"}
    assert scalar_texts("model: [\n") == {}

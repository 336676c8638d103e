"""A plain value YAML's readers cannot convert (a number of more than 4,300 digits, which
Python refuses to convert; a date like 2026-13-45) is one line naming where it came from, in an
override, a saved config and a hand-written YAML file (a cluster file), not a ValueError
traceback from inside the YAML reader."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import load_config
from recipes.config.overrides import apply_overrides
from recipes.config.yaml_file import read_yaml, unreadable_value
from recipes.registry import get_recipe

DIGITS = "9" * 5000
INT_REASON = ("a value cannot be read (Exceeds the limit (4300 digits) for integer string "
              "conversion: value has 5000 digits); write it plainly, or quote it to keep it text")


def test_the_reason_is_python_s_first_clause():
    assert unreadable_value(ValueError("month must be in 1..12")) == (
        "a value cannot be read (month must be in 1..12); write it plainly, or quote it to "
        "keep it text")
    assert unreadable_value(ValueError()).startswith("a value cannot be read (ValueError)")


def test_an_override_shows_the_start_of_a_long_value_and_its_length():
    with pytest.raises(ConfigError) as caught:
        apply_overrides(get_recipe("tiny_dp1"), [f"train.train_iters={DIGITS}"])
    assert str(caught.value) == (
        f"override 'train.train_iters={'9' * 20}...(5,000 characters)': {INT_REASON}")


def test_a_saved_config_names_itself(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"train:\n  train_iters: {DIGITS}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config file {path}: {INT_REASON}"


def test_a_hand_written_yaml_file_names_its_origin(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("gpus_per_node: 8\nbought: 2026-13-45\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(path, f"cluster={path}")
    assert str(caught.value) == (f"cluster={path}: a value cannot be read (month must be in "
                                 "1..12); write it plainly, or quote it to keep it text")

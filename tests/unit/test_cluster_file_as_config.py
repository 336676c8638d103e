"""A cluster file given as `config=` is said to be one, with the option to pass it as
(`cluster=`), rather than a guess at a `cluster.` field for its first key."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import cluster_file_problem, load_config, save_config
from recipes.registry import get_recipe

CLUSTER = "conf/cluster/h100_80gb_8x8.yaml"


def test_a_cluster_file_as_config_is_said_to_be_one() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(CLUSTER)
    assert str(caught.value) == (
        f"config file {CLUSTER} is a cluster file (nodes:, gpus_per_node:, peak_tflops:), not a "
        f"run config; pass it as cluster={CLUSTER} (plan.py, launch.py) and name the run with "
        "recipe=NAME or a saved config=runs/<run>/config.yaml")


@pytest.mark.parametrize("keys", [["model", "nodes"], ["name"], ["nodez"], ["train"]])
def test_a_run_config_or_a_stray_key_is_not_called_a_cluster_file(keys) -> None:
    assert cluster_file_problem(keys, "config file x", Path("x")) is None


def test_a_saved_run_config_still_loads(tmp_path) -> None:
    path = save_config(get_recipe("tiny_dp1"), tmp_path / "config.yaml")
    assert load_config(path).name == "tiny_dp1"

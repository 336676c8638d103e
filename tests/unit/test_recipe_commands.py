"""Every command that takes a recipe names another script's option given to it as that
script's (`pretrain.py search=true`: plan.py's), instead of handing it on as an unknown config
key: the lookup is the one default of every recipe command (`commands.recipe_command`).
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import resolved_yaml
from recipes.config.overrides import config_keys
from recipes.resolve import resolve_config
from trainer.entry.commands import COMMANDS, PRETRAIN
from trainer.entry.contract import main, parse_arguments
from trainer.entry.pipeline import Training

RECIPE_COMMANDS = [command for command in COMMANDS if command.takes_recipe]


def another_scripts_option(command) -> tuple[str, str]:
    """An option of another script that is neither this command's nor a config key, and the
    first script (in COMMANDS' order) that takes it."""
    top_level = {key.split(".")[0] for key in config_keys()} | {"recipe", "config"}
    return next((key, other.script) for other in COMMANDS for key in other.options
                if key not in command.options and "." not in key and key not in top_level)


@pytest.mark.parametrize("command", RECIPE_COMMANDS, ids=lambda command: command.script)
def test_a_recipe_command_names_another_scripts_option_as_that_scripts(command):
    key, owner = another_scripts_option(command)
    with pytest.raises(ConfigError, match=rf"^{key}= is an option of scripts/{owner}\b.*, "
                       rf"not of {command.script}; run it there$"):
        parse_arguments(command, ["recipe=tiny_dp1", f"{key}=1"])


TRAINING_COMMANDS = [command for command in COMMANDS if isinstance(command.run, Training)]


@pytest.mark.parametrize("command", TRAINING_COMMANDS, ids=lambda command: command.script)
def test_a_command_that_trains_to_measure_refuses_a_dry_run(command, capsys, tmp_path):
    """Before, `validate_resume.py dry_run=true` printed the dry run and exited 0: a job reading
    the exit code took a resume never checked for a pass. Given or in the config, one line."""
    config = tmp_path / "dry.yaml"
    config.write_text(resolved_yaml(resolve_config(["recipe=tiny_dp1", "dry_run=true"])))
    for rest in (["recipe=tiny_dp1", "dry_run=true"], [f"config={config}"]):
        assert main(command, rest) == 2
        assert capsys.readouterr().err == (
            f"error: dry_run=true: scripts/{command.script} trains to measure what it reports, "
            "and a dry run trains nothing; drop dry_run=true (scripts/pretrain.py with the same "
            "arguments and dry_run=true checks the layout without training)\n")


def test_pretrain_keeps_its_dry_run(capsys):
    assert TRAINING_COMMANDS and PRETRAIN not in TRAINING_COMMANDS  # its run decides first
    assert main(PRETRAIN, ["recipe=tiny_dp1", "dry_run=true"]) == 0
    assert "distinct shards" in capsys.readouterr().out

"""Every command that takes a recipe names another script's option given to it as that
script's (`pretrain.py search=true`: plan.py's), instead of handing it on as an unknown config
key: the lookup is the one default of every recipe command (`commands.recipe_command`).
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import config_keys
from trainer.entry.commands import COMMANDS
from trainer.entry.contract import parse_arguments

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

"""The entry modules import one way (contract <- pipeline <- commands), lazy imports inside
functions too: the contract knows no command but the one it runs, and another script's option
is named through the lookup the command hands in (`Command.option_owners`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from trainer.entry.contract import Command, parse_arguments

REPO = Path(__file__).resolve().parents[2]

ENTRY_ORDER = ("library_noise", "contract", "pipeline", "commands")


def entry_imports_out_of_order() -> list[str]:
    """Every import (lazy ones inside functions too) of a trainer/entry module by one listed
    before it: the entry modules form one line, so none can import another in a circle."""
    bad = []
    for own, name in enumerate(ENTRY_ORDER):
        tree = ast.parse((REPO / "trainer" / "entry" / f"{name}.py").read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            bad += [f"{name} imports {module}" for module in modules
                    if module.startswith("trainer.entry.")
                    and module.split(".")[2] not in ENTRY_ORDER[:own]]
    return bad


def test_the_entry_modules_import_one_way() -> None:
    assert {p.stem for p in (REPO / "trainer" / "entry").glob("*.py")} - {"__init__"} \
        == set(ENTRY_ORDER)
    assert entry_imports_out_of_order() == []


def test_the_contract_names_another_scripts_option_only_through_the_lookup_handed_in() -> None:
    """A recipe command without the lookup hands `search=true` on as a config word: the
    contract itself knows no other command. With it, the owner is named."""

    def run(args):
        return 0

    bare = Command("mine.py", run, rest="recipe=NAME", takes_recipe=True)
    assert parse_arguments(bare, ["search=true"]).rest == ("search=true",)
    told = Command("mine.py", run, rest="recipe=NAME", takes_recipe=True,
                   option_owners=lambda key: ["plan.py"] if key == "search" else [])
    with pytest.raises(ConfigError, match=r"^search= is an option of scripts/plan.py, not of "
                       r"mine.py; run it there$"):
        parse_arguments(told, ["search=true"])

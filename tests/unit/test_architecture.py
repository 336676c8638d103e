"""The house's floors, read from the code's own imports: nothing reaches back up.

plugins/ (the protocol, each plugin's config and code) sits below recipes/ (config machinery
and catalogue), which sits below trainer/ (the loop) and scripts/. The trainer reaches plugins
only through the protocol and the one registry; it never names a plugin.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Every module each .py file under `folder` imports (top-level and inside functions)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(REPO))] = names
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("plugins", ("recipes", "trainer", "scripts")),
        ("recipes", ("trainer", "scripts", "torch", "megatron")),
        ("data_prep", ("trainer", "scripts")),
        ("trainer", ("scripts",)),
    ],
)
def test_no_import_runs_up_a_floor(folder, forbidden):
    offenders = [
        f"{path} imports {name}"
        for path, names in imported_modules(folder).items()
        for name in names
        if name.split(".")[0] in forbidden
    ]
    assert offenders == []


def test_trainer_knows_no_plugin_by_name():
    offenders = [
        f"{path} imports {name}"
        for path, names in imported_modules("trainer").items()
        for name in names
        if name.startswith("plugins")
        and not name.startswith("plugins.protocol") and name != "plugins.registry"
    ]
    assert offenders == []


def test_plugin_configs_are_torch_free():
    """The schema composes plugin configs; resolving a config must not import torch."""
    for path, names in imported_modules("plugins").items():
        if path.endswith(("config.py", "registry.py")) or "protocol" in path:
            assert not {n for n in names if n.split(".")[0] in ("torch", "megatron")}, path


def test_parallel_sizes_reach_megatron_in_one_place():
    """Only trainer/mcore_translation.py spells Megatron's parallel-size keywords."""
    keyword = "tensor_model_parallel_size"
    users = [
        str(path.relative_to(REPO))
        for folder in ("recipes", "plugins", "trainer", "data_prep", "scripts")
        for path in (REPO / folder).rglob("*.py")
        if keyword in path.read_text(encoding="utf-8")
    ]
    assert users == ["trainer/mcore_translation.py"]


def test_nothing_refers_outside_the_repository():
    outside = ("../" + "shared", "shared/" + "notes")  # spelled apart: this file is scanned too
    offenders = [
        str(path.relative_to(REPO))
        for pattern in ("*.py", "*.md", "*.toml", "*.sh", "*.yaml")
        for path in REPO.rglob(pattern)
        if not any(part.startswith(".") or part == "runs" for part in path.relative_to(REPO).parts)
        and any(text in path.read_text(encoding="utf-8", errors="replace") for text in outside)
    ]
    assert offenders == []


def test_test_files_have_unique_names():
    """The test folders are not packages, so pytest imports test files by basename: two files
    of one name in unit/ and dist/ stop the whole suite at collection."""
    names = [path.name for path in (REPO / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_no_merge_leftovers_are_tracked():
    """Backup files of a patch or merge (`*.orig`, `*.rej`) are never part of the house."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [name for name in tracked if name.endswith((".orig", ".rej"))] == []

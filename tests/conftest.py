"""Work units for a run over both cores (`pytest -n 2`, pytest-xdist's `--dist loadgroup`).

Each test is given an `xdist_group`, the unit one worker process runs whole:

- the tests that start gloo ranks (tests/dist) share one unit, run first, so one fork server
  serves them; the files marked `scripts_unit` (they launch through the scripts and time
  nothing) are a second unit, run last, beside the first by the worker through with
  everything else;
- the Slurm tier is a unit (its session fixture starts the one Slurm of the run), as is the GPU
  tier (one device);
- any other test is in its file's unit, merged with every file that reads the same session
  fixture of ours (the dry-run probes, the tiny Llama import): each is built once per run.

The ranks' unit runs on one worker while the other works through the rest, so the suite takes
about as long as the ranks' unit. `-n` alone schedules by these units (`pytest_configure` below);
without `-n` the marks change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

ONE_UNIT_TIERS = {"dist": "ranks", "slurm": "slurm", "gpu": "gpu"}  # tier folder -> its unit
# The mark of the files that start their ranks through the scripts (not `launch_ranks`) and
# time nothing: a unit of their own, run last, by the worker that is through with the rest
# while the ranks' unit still runs. Registered in pyproject.toml.
LAST_UNIT = "scripts"
LAST_UNIT_MARK = "scripts_unit"


def tier_unit(path: Path) -> str | None:
    """The unit of a test under a tier that runs as one (the folder below the last `tests`),
    else None."""
    parts = path.parts
    if "tests" not in parts:
        return None
    below = parts[len(parts) - parts[::-1].index("tests"):]
    return ONE_UNIT_TIERS.get(below[0]) if len(below) >= 2 else None


def item_unit(item: pytest.Item) -> str | None:
    """The unit a test runs in whatever its file: the scripts' unit for a test marked so, its
    tier's for a test under a tier that runs as one, else None."""
    if item.get_closest_marker(LAST_UNIT_MARK) is not None:
        return LAST_UNIT
    return tier_unit(Path(str(item.fspath)))


def shared_fixtures(item: pytest.Item) -> set[str]:
    """The session fixtures of ours (defined under tests/) the test reads, directly or not."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope == "session"
            and defs[-1].baseid.startswith("tests")}


def work_units(items: list[pytest.Item]) -> dict[str, str]:
    """{nodeid: unit}: one file's tests share a unit, and files reading one session fixture of
    ours are merged (union-find over files and fixtures)."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    keys = {}
    for item in items:
        tier = item_unit(item)
        key = tier or item.nodeid.split("::", 1)[0]
        root(key)
        if not tier:
            for fixture in shared_fixtures(item):
                join(key, f"fixture {fixture}")
        keys[item.nodeid] = key
    # a unit is named by its first file: each xdist worker must name each test's unit alike
    names: dict[str, str] = {}
    for key in sorted(key for key in parent if not key.startswith("fixture ")):
        names.setdefault(root(key), key)
    return {nodeid: names[root(key)] for nodeid, key in keys.items()}


def pytest_configure(config):
    """`-n N` without `--dist` schedules by the units above: xdist's default (`load`, test by
    test) would start two rank launches at once and build each session fixture in both workers.
    A worker learns it from the controller (`pytest_configure_node`): it names its tests'
    units only under `loadgroup`, which it reads from its own command line."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get("units"):
            config.option.loadgroup = True
        return
    asked = any(arg.startswith("--dist") for arg in config.invocation_params.args)
    if getattr(config.option, "numprocesses", None) and config.option.dist == "load" and not asked:
        config.option.dist = "loadgroup"
        config.option.loadscopereorder = False  # units in the order below: the ranks' first


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["units"] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    units = work_units(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
    items.sort(key=lambda item: units[item.nodeid] == LAST_UNIT)  # stable: the rest as collected

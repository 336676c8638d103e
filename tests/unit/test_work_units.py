"""The suite's work units over two cores (tests/conftest.py): what must share one worker does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import work_units


def fixture(scope: str, baseid: str) -> list:
    return [SimpleNamespace(scope=scope, baseid=baseid)]


OURS = fixture("session", "tests/unit")  # a session fixture in a conftest of ours


def item(path: str, name: str = "test_a", marks: tuple[str, ...] = (),
         **fixtures) -> SimpleNamespace:
    return SimpleNamespace(fspath=f"/repo/{path}", nodeid=f"{path}::{name}",
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=fixtures),
                           get_closest_marker=lambda mark: mark if mark in marks else None)


def test_a_tier_that_starts_ranks_or_services_is_one_unit_whatever_its_fixtures():
    items = [item("tests/dist/test_a.py"), item("tests/dist/test_b.py", probes=OURS),
             item("tests/slurm/test_s.py"), item("tests/gpu/test_g.py"),
             item("tests/dist/test_pretrain_script.py")]
    assert list(work_units(items).values()) == ["ranks", "ranks", "slurm", "gpu", "ranks"]


def test_a_test_marked_scripts_unit_runs_in_the_scripts_unit_wherever_it_is():
    items = [item("tests/dist/test_pretrain_script.py", marks=("scripts_unit",)),
             item("tests/unit/test_x.py", marks=("scripts_unit",), probes=OURS),
             item("tests/unit/test_y.py", probes=OURS)]
    assert list(work_units(items).values()) == ["scripts", "scripts", "tests/unit/test_y.py"]


def test_the_files_marked_for_the_scripts_unit_start_no_ranks_of_their_own():
    """A file in the scripts' unit runs beside the ranks' unit: one that started ranks through
    `launch_ranks` or the one-rank fixture would launch beside another launch."""
    dist = Path(__file__).resolve().parents[1] / "dist"
    marked = [path for path in sorted(dist.glob("test_*.py"))
              if "pytest.mark.scripts_unit" in path.read_text()]
    assert marked, "no tests/dist file is marked scripts_unit"
    for path in marked:
        text = path.read_text()
        assert "launch_ranks" not in text and "one_rank_world" not in text, path.name


def test_a_file_is_a_unit_and_files_sharing_a_session_fixture_of_ours_are_merged():
    items = [item("tests/unit/test_a.py"), item("tests/unit/test_a.py", "test_b"),
             item("tests/unit/test_b.py", probes=OURS),
             item("tests/unit/test_c.py", probes=OURS, tiny_import=OURS),
             item("tests/unit/test_d.py", tiny_import=OURS),
             item("tests/unit/test_e.py")]
    units = list(work_units(items).values())
    assert units[0] == units[1] == "tests/unit/test_a.py"
    assert units[2] == units[3] == units[4] == "tests/unit/test_b.py"  # b, d through c
    assert len({units[0], units[2], units[5]}) == 3


def test_builtin_and_narrower_fixtures_merge_nothing():
    items = [item("tests/unit/test_a.py", tmp_path_factory=fixture("session", ""),
                  module_thing=fixture("module", "tests/unit"), plain=fixture("function", "")),
             item("tests/unit/test_b.py", tmp_path_factory=fixture("session", ""),
                  module_thing=fixture("module", "tests/unit"), plain=fixture("function", ""))]
    assert list(work_units(items).values()) == ["tests/unit/test_a.py", "tests/unit/test_b.py"]


def test_a_unit_is_named_alike_whatever_order_the_tests_come_in():
    """Each xdist worker collects on its own and must name each test's unit as the others do."""
    items = [item("tests/unit/test_c.py", probes=OURS, tiny_import=OURS),
             item("tests/unit/test_b.py", tiny_import=OURS),
             item("tests/unit/test_d.py", probes=OURS)]
    forward, backward = work_units(items), work_units(items[::-1])
    assert forward == backward and set(forward.values()) == {"tests/unit/test_b.py"}

"""The docs' "claim | test" tables cannot go stale: every test they name exists.

docs/README.md ("Where the project's claims are tested") and the pages with a table of their
own list each claim beside the tests that hold it. Here every row must name at least one test
file (a path under tests/, or a glob of them) or say it is not tested; every file named must
exist; every test function named (`test_...`) must be defined in one of the row's files; and a
row that says "not tested" must not hide a test that already runs what it names: a script of
the claim that a test runs must be named in the row, with what that test leaves untested.
Test functions are named `test_y` beside their file or as `tests/x.py::test_y`.
Whether a named test asserts its claim is read by people; this keeps what they read true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADER = re.compile(r"^\|\s*claim\s*\|\s*test\s*\|\s*$")
CODE = re.compile(r"`([^`]+)`")
NOT_TESTED = re.compile(r"^not tested\b")


def claim_tables() -> dict[str, list[tuple[str, str]]]:
    """(claim, test) rows of every "| claim | test |" table under docs/, by file."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((REPO / "docs").glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            if not HEADER.match(line):
                continue
            rows = tables.setdefault(path.name, [])
            for row in lines[index + 2:]:  # after the |---|---| line
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]
                assert len(cells) == 2, f"{path.name}: a row that is not claim | test: {row}"
                rows.append((cells[0], cells[1]))
    return tables


TABLES = claim_tables()
ROWS = [(name, claim, test) for name, rows in TABLES.items() for claim, test in rows]


def named_files(cell: str) -> list[str]:
    """The test paths (or globs) a cell names (`tests/x.py`, or `tests/x.py::test_y`)."""
    return [code.split("::")[0] for code in CODE.findall(cell) if code.startswith("tests/")]


def named_functions(cell: str) -> list[str]:
    """The test functions a cell names: `test_y` alone or as `tests/x.py::test_y`."""
    return [code.split("::")[-1] for code in CODE.findall(cell)
            if re.fullmatch(r"(tests/\S+::)?test_\w+", code)]


def files_of(pattern: str) -> list[Path]:
    return sorted(REPO.glob(pattern)) if "*" in pattern else (
        [REPO / pattern] if (REPO / pattern).is_file() else [])


def defined_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_the_readme_table_is_found_with_its_rows():
    assert len(TABLES.get("README.md", [])) > 30
    assert {"README.md", "scaling.md", "planner.md", "logging.md", "hf-interop.md"} <= set(TABLES)


def _id(row) -> str:
    return f"{row[0]}:{row[1][:40]}"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_row_names_a_test_or_says_it_is_not_tested(row):
    _, claim, test = row
    assert claim, row
    assert named_files(test) or NOT_TESTED.match(test), (
        f"{row}: name the test file(s) holding the claim, or say 'not tested: <why>'")


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_named_test_file_exists(row):
    missing = [pattern for pattern in named_files(row[2]) if not files_of(pattern)]
    assert missing == [], f"{row[0]}: {missing} named for '{row[1][:60]}' do not exist"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_named_test_function_is_defined_in_the_rows_files(row):
    files = [path for pattern in named_files(row[2]) for path in files_of(pattern)]
    defined = set().union(*(defined_functions(path) for path in files)) if files else set()
    missing = [name for name in named_functions(row[2]) if name not in defined]
    assert missing == [], f"{row[0]}: {missing} are not defined in {named_files(row[2])}"


def _tests_running(script: str) -> list[str]:
    """Test files (tests/**/test_*.py) that name `script`'s file, i.e. run or read it."""
    return sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")
                  if Path(script).name in path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("row", [row for row in ROWS if NOT_TESTED.match(row[2])], ids=_id)
def test_a_row_not_tested_names_the_tests_that_run_its_scripts(row):
    """A claim 'not tested' whose script a test now runs is stale unless the row says which
    test runs it and what that test leaves unjudged."""
    _, claim, test = row
    scripts = [code for code in CODE.findall(claim) if re.fullmatch(r"scripts/\w+\.py", code)]
    unnamed = {script: running for script in scripts
               if (running := [t for t in _tests_running(script) if t not in named_files(test)])}
    assert unnamed == {}, f"{row[0]}: '{claim[:60]}' says not tested; these tests run it"

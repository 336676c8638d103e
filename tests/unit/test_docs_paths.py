"""Every repository path the README and docs/ name exists, so a moved or renamed file fails here
rather than in front of a reader.

The pages are read when the test runs (README.md and every docs/*.md then present), and a path
counts when it is written in backticks or a code block and starts with one of the repository's
own folders (`scripts/x.py`, `conf/.../x.yaml`, `docs/x.md`, `trainer/.../x.py`, ...), or is the
target of a relative Markdown link. `conf/cluster/<name>.yaml` checks its folder, a glob
(`tests/unit/test_plan_*.py`) must match a file, and a path a command on the same page writes
(`cat > conf/data/web.yaml`, `cp A conf/cluster/mine.yaml`) is the reader's own, not ours.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("scripts", "conf", "docs", "trainer", "recipes", "plugins", "data_prep", "tests", ".ci")
# A repository path: one of our folders at the start of a word (not inside another path such as
# megatron/core/... or a site-packages path), then path characters, placeholders and globs.
PATH = re.compile(r"(?<![\w/.<>$~-])((?:" + "|".join(map(re.escape, FOLDERS)) + r")/[\w./*<>-]*)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# What a command on the page writes: `> PATH` (a redirection, not an arrow), `cp SOURCE PATH`.
WRITTEN = re.compile(r"(?:(?<=\s)>\s*|\bcp\s+\S+\s+)(\S+)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def repository_paths(text: str) -> set[str]:
    """The repository paths in a page's backticks and code blocks, trailing punctuation off."""
    found = set()
    for span in CODE.findall(text):
        for match in PATH.finditer(span):
            found.add(match.group(1).rstrip(".,:;"))
    return found


def written_paths(text: str) -> set[str]:
    return {match.group(1) for span in CODE.findall(text) for match in WRITTEN.finditer(span)}


def missing(path: str) -> bool:
    if "<" in path:  # conf/cluster/<name>.yaml: the folder it names must exist
        return not (REPO / path.split("<")[0].rsplit("/", 1)[0]).is_dir()
    if "*" in path:
        return not any(REPO.glob(path))
    return not (REPO / path).exists()


def broken_links(page: Path, text: str) -> list[str]:
    targets = (target.split("#")[0] for target in LINK.findall(text)
               if not target.startswith(("http://", "https://", "mailto:", "#")))
    return [target for target in targets if not (page.parent / target).exists()]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_path_a_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    absent = sorted(path for path in repository_paths(text) - written_paths(text)
                    if missing(path))
    assert not absent, f"{page.relative_to(REPO)} names paths that do not exist: {absent}"
    assert not broken_links(page, text), f"broken links: {broken_links(page, text)}"


def test_the_check_finds_a_moved_file_and_spares_what_is_not_ours(tmp_path):
    """Planted: a path that moved, a placeholder, a glob, a path the page writes, another
    project's path, a broken and a good relative link."""
    text = "\n".join([
        "`trainer/checkpointing_old.py`, `scripts/pretrain.py:12`, `tests/unit/test_plan_*.py`",
        "`conf/cluster/<name>.yaml`, `conf/nowhere/<name>.yaml`, `megatron/core/tests/x.py`",
        "```bash", "cat > conf/data/mine.yaml <<'EOF'", "EOF",
        "cp conf/cluster/h100_80gb_8x8.yaml conf/cluster/mine.yaml",
        "resolve -> trainer/entry/gone.py", "```",
        "[a page](docs/README.md) [gone](docs/gone.md#part) [web](https://example.com/x.md)",
    ])
    paths = repository_paths(text) - written_paths(text)
    assert sorted(path for path in paths if missing(path)) == [
        "conf/nowhere/<name>.yaml", "trainer/checkpointing_old.py", "trainer/entry/gone.py"]
    assert "megatron/core/tests/x.py" not in paths and "tests/x.py" not in paths
    assert broken_links(REPO / "README.md", text) == ["docs/gone.md"]


def test_the_readme_stays_a_newcomers_path():
    """At most 200 lines, in the order a newcomer walks: what it is, install, the two set-up
    commands, a CPU quickstart, training on a cluster, the recipes, where the code is; the
    reference material lives in docs/."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Install", "## Set-up commands (fresh machine)",
                        "## Quickstart on CPU", "## Train on your cluster", "## Recipes",
                        "## Where the code is"]

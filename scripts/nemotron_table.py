"""Write docs/nemotron.md: every Nemotron recipe's settings beside their sources.

usage: python scripts/nemotron_table.py [out=docs/nemotron.md]

The page is generated from the recipes' own tables of settings and sources (recipes/sources.py,
the family's recipes in recipes/nemotron/); without out= it is printed. A unit test fails when
the committed page differs from what this writes.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import NEMOTRON_TABLE  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(NEMOTRON_TABLE))

"""A user's path with its symbolic links followed, without a traceback when a link loops.

Python 3.12's `Path.resolve()` raises `RuntimeError("Symlink loop from ...")` for a path
through a link that points at itself (3.13 returns the path instead), and several rules compare
or place paths resolved before they look at them: a looping `run_dir=` or an `output=` under
one ended in that traceback. `os.path.realpath` follows what it can and leaves a loop as
written, so the rule that then looks at the path (does it exist, is it a directory, can it be
written) says what is wrong in its own one line.
"""

from __future__ import annotations

import os
from pathlib import Path


def resolved(path: str | os.PathLike) -> Path:
    """`path` absolute, its links followed; a link that loops is left as written."""
    return Path(os.path.realpath(path))

"""Run `scripts/launch.py` once per command line given, in one interpreter, one after another.

    python -m tests.slurm.launch_many '[["recipe=tiny_dp2", "cluster=..."], [...]]'

Each run is the script itself (`runpy`, as `python scripts/launch.py ARGS` runs it), with its
stdout, stderr and exit code printed as one JSON line as soon as it ends. One interpreter for all
the submits of the Slurm tier imports torch and NeMo-Run once (about 10 CPU-seconds per launch
otherwise), which the tier's jobs need more.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[2] / "scripts" / "launch.py"


def launch_once(args: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [str(LAUNCH), *args]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(str(LAUNCH), run_name="__main__")
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except Exception:  # noqa: BLE001 - a traceback is the test's to show, not to hide
            traceback.print_exc()
            code = 1
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    for args in json.loads(sys.argv[1]):
        print(json.dumps(launch_once(args)), flush=True)


if __name__ == "__main__":
    main()

"""Probe scripts run over the recipes in subprocesses, split over the machine's cores.

A probe (tests/unit/dry_run_probe.py, layout_groups_probe.py) changes process-wide state
(the CPU runtime's patches, fake process groups), so it runs apart from the test process; the
suite runs one test at a time, so one probe process would leave the other cores idle. Parts are
contiguous by name, so a family whose recipes share work (the 405B layouts) stays in one
process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.hang import HANG_S, cores

REPO = Path(__file__).resolve().parents[2]
MOST_PARTS = 4


def start_probe(script: str, names: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "unit" / script), *names],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )


def split_probe(script: str, names: list[str]) -> list[dict]:
    """`script` over `names`, one process per core at once; each part's last stdout line as
    JSON, in the order of the parts."""
    names = sorted(names)
    parts = min(cores(), MOST_PARTS)
    size = -(-len(names) // parts)
    processes = [start_probe(script, names[i:i + size]) for i in range(0, len(names), size)]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=HANG_S)
        assert process.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.splitlines()[-1]))
    return outputs

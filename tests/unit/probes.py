"""Probe scripts run over the recipes in subprocesses, split over the machine's cores.

A probe (tests/unit/dry_run_probe.py, layout_groups_probe.py, both run by recipe_probe.py)
changes process-wide state (the CPU runtime's patches, fake process groups), so it runs apart
from the test process; the suite runs one test at a time, so one probe process would leave the
other cores idle. The parts are balanced by each caller's cost estimate, longest first (a split
by name put the 405B and Nemotron 3 recipes all in one part: 29 s against 4 s). A family of
recipes whose work the probe shares within one process (the dry run builds the three Llama 3.1
405B layouts' shards once) stays in one part and costs as its dearest member.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
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


def balanced_parts(names: list[str], cost: Callable[[str], float], parts: int,
                   family: Callable[[str], object] = lambda name: name) -> list[list[str]]:
    """`names` in at most `parts` non-empty parts of about equal total cost: each family (its
    cost: its dearest member's) goes, dearest first, to the part with the least so far."""
    families: dict[object, list[str]] = {}
    for name in sorted(names):
        families.setdefault(family(name), []).append(name)
    loads = [0.0] * min(parts, len(families))
    split: list[list[str]] = [[] for _ in loads]
    for members in sorted(families.values(), key=lambda m: (-max(map(cost, m)), m[0])):
        least = loads.index(min(loads))
        split[least] += members
        loads[least] += max(map(cost, members))
    return [sorted(part) for part in split]


def part_count() -> int:
    """How many parts a probe is split into: one per core, at most MOST_PARTS."""
    return min(cores(), MOST_PARTS)


def probe_parts(script: str, parts: list[list[str]]) -> list[dict]:
    """`script` once per part (its names on argv), all at once; each part's last stdout line as
    JSON, in the order of the parts."""
    processes = [start_probe(script, part) for part in parts]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=HANG_S)
        assert process.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.splitlines()[-1]))
    return outputs

"""Subprocess body of the session's `recipe_probes` (tests/unit/conftest.py): both probes of the
recipes named on argv, in one interpreter, so that a part imports torch and Megatron Core once
for both (about 6 s of CPU an interpreter).

    python tests/unit/recipe_probe.py layout_groups:<recipe> ... dry_run:<recipe> ...

`layout_groups:` Megatron Core's own groups (layout_groups_probe.py), all of them first: the
dry run activates the CPU runtime's process-wide patches, and Megatron's groups are probed
before any patch. `dry_run:` each distinct shard built on the meta device (dry_run_probe.py).
Output: one JSON line, {"layout_groups": {recipe: ...}, "dry_run": {recipe: ...},
"seconds": {"layout_groups": s, "dry_run": s}}.
"""

from __future__ import annotations

import json
import sys
import time

KINDS = ("layout_groups", "dry_run")  # in the order they run


def probe_all(arguments: list[str]) -> dict:
    names = {kind: [a.split(":", 1)[1] for a in arguments if a.startswith(f"{kind}:")]
             for kind in KINDS}
    found: dict = {"seconds": {}, **{kind: {} for kind in KINDS}}
    for kind in (kind for kind in KINDS if names[kind]):
        start = time.perf_counter()
        if kind == "layout_groups":
            from tests.unit.layout_groups_probe import probe
        else:
            from tests.unit.dry_run_probe import probe
        found[kind] = {name: probe(name) for name in names[kind]}
        found["seconds"][kind] = time.perf_counter() - start
    return found


if __name__ == "__main__":
    print(json.dumps(probe_all(sys.argv[1:])))

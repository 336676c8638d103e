"""One rank of a `launch_ranks` run: forked by tests/dist/fork_server.py (what the fixture
uses), or started by torch.distributed.run for debugging a case by hand:

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/dist/rank_entry.py \
        MODULE:FUNCTION PAYLOAD_JSON RESULT_DIR TIMEOUT_S

Joins the gloo process group, calls FUNCTION(payload) and writes its JSON-serialisable return
value to RESULT_DIR/rank<RANK>.json. This rank's stderr goes to RESULT_DIR/rank<RANK>.stderr so
the launcher can show each rank's own error. Whether the CPU runtime is activated is up to
FUNCTION (the payload can carry what it needs, e.g. which patches to skip). The optional
payload key "threads" sets torch's intra-op threads before anything runs (default 1).
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import json
import os
import sys
from pathlib import Path


def _send_stderr_to_file(result_dir: Path, rank: int) -> None:
    # At the file-descriptor level, so C++ errors (gloo, torch) land there too.
    stderr_file = open(result_dir / f"rank{rank}.stderr", "w")  # open until exit
    os.dup2(stderr_file.fileno(), 2)


def _resolve(entry: str):
    module_name, _, function_name = entry.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def start_rank(rank: int, result_dir: Path) -> None:
    """Sends this rank's stderr to its file and records its pid (torchrun and the fork server
    start each rank in a session of its own; the launcher kills a hung rank by this pid)."""
    _send_stderr_to_file(result_dir, rank)
    # A rank that dies of a signal (glibc aborting on a damaged heap, a segfault) leaves every
    # thread's Python stack in its stderr file.
    faulthandler.enable(all_threads=True)
    (result_dir / f"rank{rank}.pid").write_text(str(os.getpid()))


def run_rank(entry: str, payload_path: Path, result_dir: Path, timeout_s: float,
             store=None) -> None:
    """Joins the gloo group (through `store` when given, else torchrun's environment), calls
    the entry and writes its result."""
    import torch
    import torch.distributed as dist

    payload = json.loads(payload_path.read_text())
    torch.set_num_threads(int(payload.get("threads", 1)))
    # Collectives give up after the launch's own timeout instead of gloo's 30 min default.
    timeout = datetime.timedelta(seconds=timeout_s)
    # The world group too runs on one gloo worker, as every group of a training rank does (its
    # CPU runtime is active before it joins: trainer/cpu_runtime/collectives.py).
    from trainer.cpu_runtime.collectives import install_one_gloo_worker

    install_one_gloo_worker()
    if store is None:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    try:
        result = _resolve(entry)(payload)
        rank = int(os.environ["RANK"])
        partial = result_dir / f"rank{rank}.json.partial"
        partial.write_text(json.dumps(result))
        partial.rename(result_dir / f"rank{rank}.json")
    finally:
        if dist.is_initialized():  # the entry may have torn it down itself
            dist.destroy_process_group()


def main() -> None:
    entry, payload_path, result_dir, timeout_s = sys.argv[1:5]
    result_dir = Path(result_dir)
    start_rank(int(os.environ["RANK"]), result_dir)
    run_rank(entry, Path(payload_path), result_dir, float(timeout_s))


if __name__ == "__main__":
    main()

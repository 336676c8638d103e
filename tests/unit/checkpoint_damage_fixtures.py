"""A checkpoint root as this project saves it (steps with Megatron's marker, a `run.json` listing
every file, `latest`), built without torch, for the damage rules' tests."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from recipes.registry import get_recipe

FILES = {"metadata.json": b'{"sharded_backend": "torch_dist"}', ".metadata": b"index",
         "__0_0.distcp": b"tensor bytes"}


def project_step(path: Path, step: int) -> Path:
    path.mkdir(parents=True)
    for name, data in FILES.items():
        (path / name).write_bytes(data)
    files = {name: {"bytes": len(data), "crc32": zlib.crc32(data)} for name, data in FILES.items()}
    (path / "run.json").write_text(json.dumps({
        "format": 1, "step": step, "consumed_samples": 8 * step, "consumed_tokens": 0,
        "versions": {}, "files": files}))
    return path


def project_root(root: Path, steps=(2, 4, 6)) -> Path:
    for step in steps:
        project_step(root / f"step_{step:07d}", step)
    (root / "latest").write_text(f"step_{steps[-1]:07d}")
    return root


def load_cfg(load: Path, *, verify: str = "checksum"):
    cfg = get_recipe("tiny_dp1")
    cfg.checkpoint.load = str(load)
    cfg.checkpoint.verify = verify
    return cfg

"""GPU tier: every test here is marked `gpu` and skipped on machines without CUDA."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)

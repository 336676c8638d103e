"""The session's real Slurm (tests/slurm/local_slurm.py): started once, on first use, and
stopped by PID at the end; every test here skips with the reason where it cannot run."""

from __future__ import annotations

import pytest

from tests.slurm.local_slurm import LocalSlurm, why_not_here


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = why_not_here()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()

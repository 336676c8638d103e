"""The session's real Slurm (tests/slurm/local_slurm.py): started once, on first use, and
stopped by PID at the end; every test here skips with the reason where it cannot run.

A tier of its own, not under tests/dist: its ranks are Slurm's (sbatch, srun, torchrun), never
`launch_ranks`', and it alone needs root and the slurm-wlm and munge packages."""

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

"""The record of one patch of Megatron's behaviour, which each patch's home declares and
`trainer/megatron_patches.py` collects into the one table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One patch: its name, the Megatron symbol and file:line it works around, why (one line),
    and the test file whose self-test shows what breaks or differs without it."""

    name: str
    works_around: str
    why: str
    self_test: str

"""The record of one patch of Megatron's behaviour, which each patch's home declares and
`trainer/megatron_patches.py` collects into the one table, and the install-once set of patches
that the CPU runtime and the step fixes each apply.

Both homes install their patches for the whole process, and a patch applied twice would wrap
Megatron's method in itself; so the first call decides which are applied and later calls change
nothing, and a name to skip that is not a patch of the set is refused (a self-test would
otherwise pass without leaving anything out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One patch: its name, the Megatron symbol and file:line it works around, why (one line),
    and the test file whose self-test shows what breaks or differs without it."""

    name: str
    works_around: str
    why: str
    self_test: str


def refuse_unknown(what: str, skip: Iterable[str],
                   known: tuple[str, ...] | list[str]) -> frozenset[str]:
    """`skip` as a frozenset; a ValueError naming the unknown names and `known` when any is
    not one of `known`."""
    skip = frozenset(skip)
    unknown = skip - set(known)
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; known: {known}")
    return skip


class PatchSet:
    """Named installers applied once per process. `names` are every patch of the set that
    `skip` may name (the installers' and any the caller applies itself, in `after`)."""

    def __init__(self, what: str, installers: dict[str, Callable[[], None]],
                 names: tuple[str, ...] | None = None) -> None:
        self.what = what  # how the error names the set, e.g. "step fixes"
        self.installers = installers  # in the order they are applied
        self.names = tuple(installers) if names is None else names
        self.applied: frozenset[str] | None = None  # None until the first call decides

    def install_once(self, skip: Iterable[str] = frozenset(), *,
                     before: Callable[[], None] | None = None,
                     after: Callable[[frozenset[str]], None] | None = None) -> None:
        """Every installer but those `skip` names, then `after(skip)`; `before` runs once the
        names are checked, ahead of any installer. A second call is a no-op."""
        if self.applied is not None:
            return
        skip = refuse_unknown(self.what, skip, self.names)
        if before is not None:
            before()
        for name, install in self.installers.items():
            if name not in skip:
                install()
        if after is not None:
            after(skip)
        self.applied = frozenset(self.names) - skip

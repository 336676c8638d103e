"""The paths a Slurm job reads and writes: what a container mounts by default, and which of
them a dry run on another machine cannot see.

Why: inside a container (pyxis/enroot) a job sees only what is mounted. The data its blend
names, the checkpoint it loads, the run and job directories and this checkout are where every
rank reads and writes, so a container launch mounts each at its own path (the config's paths
keep their meaning inside) unless the user's own mounts already do. And a `--dry-run` on a
laptop or a login node without the cluster's file systems still renders the job: the paths that
do not exist here are named in one line and left to the job's first step, which checks every
path on the cluster before any rank starts (`scripts/pretrain.py check=paths`).

Relative paths in a config are relative to the directory the job runs in, this checkout (the
job's code directory is a link to it); torch-free, like everything the launcher checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.config.blend import named_paths
from recipes.config.links import resolved

REPO = Path(__file__).resolve().parents[2]
@dataclass(frozen=True)
class NamedPath:
    """One path a run names: the field that names it and the path, absolute for the job."""

    field: str
    path: Path
    is_file: bool  # a file (or a dataset prefix), whose folder a container mounts

    @property
    def folder(self) -> Path:
        return self.path.parent if self.is_file else self.path


def on_the_job(path: str | Path) -> Path:
    """`path` as the job resolves it: relative to this checkout, where the job runs."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO / path


def _blend_files(field: str, blend: str) -> list[NamedPath]:
    """A blend and what it names: files and dataset prefixes, and tokenizer folders (a path
    not here is taken for a file: its folder is what a container mounts)."""
    return [NamedPath(field, on_the_job(name), is_file=not on_the_job(name).is_dir())
            for name in named_paths(str(on_the_job(blend)))]


def config_paths(cfg: Any) -> list[NamedPath]:
    """Every path the run reads or writes besides the job's own directories: its blend and
    each phase's (with what they name), the checkpoint it loads, the cluster file, its run
    directory when one is given."""
    found: list[NamedPath] = []
    if cfg.data.source == "blend" and cfg.data.blend:
        found += _blend_files("data.blend", cfg.data.blend)
    for phase in cfg.phases:
        if phase.blend and phase.blend != cfg.data.blend:
            found += _blend_files("phases", phase.blend)
    if cfg.checkpoint.load:
        found.append(NamedPath("checkpoint.load", on_the_job(cfg.checkpoint.load), False))
    if cfg.cluster.spec:
        found.append(NamedPath("cluster.spec", on_the_job(cfg.cluster.spec), True))
    if cfg.run_dir:
        found.append(NamedPath("run_dir", on_the_job(cfg.run_dir), False))
    return found


def _root_missing(path: Path) -> bool:
    """Whether the file system `path` lies on is not here: its first folder below / is absent
    (`/lustre/...` on a laptop), so nothing about it can be checked here."""
    parts = path.parts
    return len(parts) > 1 and not Path(parts[0], parts[1]).exists()


def cluster_only(cfg: Any) -> list[NamedPath]:
    """The paths the run names that do not exist on this machine (a run directory: whose file
    system is not here), for a dry run to leave to the job's first step."""
    absent = []
    for named in config_paths(cfg):
        gone = _root_missing(named.path) if named.field == "run_dir" else not named.path.exists()
        if gone:
            absent.append(named)
    return absent


def cluster_only_line(absent: Sequence[NamedPath]) -> str:
    """The one line a dry run prints for the paths it could not see."""
    listed = ", ".join(f"{named.field}: {named.path}" for named in absent)
    return (f"paths not on this machine, checked on the cluster by the job's first step "
            f"(scripts/pretrain.py check=paths) before any rank starts: {listed}")


# --- container mounts -------------------------------------------------------------------------

def _identity_sources(mounts: Sequence[str]) -> list[Path]:
    """The sources of mounts that keep their path inside the container (`/a` or `/a:/a`)."""
    sources = []
    for mount in mounts:
        parts = mount.split(":")
        if len(parts) == 1 or parts[0] == parts[1]:
            sources.append(Path(parts[0]))
    return sources


def _covered(path: Path, by: Sequence[Path]) -> bool:
    return any(path == source or source in path.parents for source in by)


def container_mounts(cfg: Any, job_dir: str, run_dir: str | None,
                     given: Sequence[str] = (), python: str | None = None,
                     files: Sequence[str] = ()) -> list[str]:
    """Every mount of a container launch: the user's (`given`: the cluster file's, then the
    command line's), then, each at its own path, what the run needs that they do not cover:
    this checkout, the job directory, the run directory, the folders of the data and files the
    config names and of `files` (the cluster file), and a Python named by path
    (`container_python=`, its environment's folder)."""
    needed = [REPO, Path(job_dir)]
    if run_dir:
        needed.append(on_the_job(run_dir))  # a relative one lies in this checkout, mounted
    needed += [named.folder for named in config_paths(cfg)]
    needed += [resolved(on_the_job(file)).parent for file in files]
    if python and python.startswith("/"):
        needed.append(Path(python).parent.parent)  # <env>/bin/python: the environment
    kept: list[Path] = []
    for path in sorted(dict.fromkeys(needed), key=lambda p: (len(p.parts), str(p))):
        if not _covered(path, [*_identity_sources(given), *kept]):
            kept.append(path)
    return [*given, *(f"{path}:{path}" for path in kept)]

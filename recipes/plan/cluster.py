"""Cluster files (`conf/cluster/*.yaml`): the machine a plan is made for.

A cluster file says what the planner cannot know from a recipe: GPUs per node, memory per GPU,
bandwidth inside a node and between nodes (per GPU, one direction), and peak dense TFLOP/s by
precision; optionally what a Slurm job asks for besides (`device: cpu` for nodes without GPUs,
whose ranks are processes; `cpus_per_task` or `exclusive`, so a node's ranks are not all
pinned to the one CPU Slurm gives a task by default; `host_cores`, the cores a CPU node's
ranks share, which the step model prices when there are more ranks than cores), and the site
settings every launch on it shares (account, partition, time limit, container image and
mounts), so they are written once rather than on every command. It is read here, without
torch, and every mistake is one line naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.config.yaml_file import not_a_file, read_yaml

PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
# Peaks a cluster file gives only where its GPUs have them: FP4 GEMMs exist on Blackwell only.
OPTIONAL_PRECISIONS = ("fp4",)
CLUSTER_DIR = Path(__file__).resolve().parents[2] / "conf" / "cluster"


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    nodes: int  # nodes that exist
    gpus_per_node: int
    gpu_memory_gb: float  # GB = 1e9 bytes
    intra_node_gb_per_s: float  # per GPU, one direction
    inter_node_gb_per_s: float  # per GPU, one direction
    attention: str  # 'flash' (scores never stored) or 'explicit' (n x n scores kept)
    peak_tflops: dict[str, float]  # dense, per GPU, by precision
    host_memory_gb: float | None = None  # CPU memory of one node (None: not checked)
    device: str = "gpu"  # what a rank runs on: 'gpu', or 'cpu' (no GPU request on Slurm)
    cpus_per_task: int | None = None  # CPUs Slurm gives each node's torchrun (None: its default)
    exclusive: bool = False  # ask Slurm for whole nodes
    # The layout search's GEMM model (recipes/plan/steptime.py; None: its defaults): the share
    # of peak a large GEMM reaches, and the dimension at which a GEMM's throughput halves.
    gemm_peak_fraction: float | None = None
    gemm_half_dim: float | None = None
    # Seconds one collective costs beyond its bytes (per message, microseconds; None: not
    # priced), measured with the bandwidth by `plan.py calibrate=true`.
    collective_latency_us: float | None = None
    # Seconds one small kernel costs whatever its work (microseconds; None: not priced): what
    # many small operators cost beyond their FLOPs; timed with every rank of the node busy on
    # GPUs, on one rank alone on CPU (sharing the cores is `host_cores`'s term).
    kernel_overhead_us: float | None = None
    # CPU cores a node's ranks share (`device: cpu` files only; None: a core, or a GPU, per
    # rank), written by `plan.py calibrate=true`: more ranks than cores compete for them.
    host_cores: int | None = None
    # Site settings of a Slurm launch (scripts/launch.py; its own options win over them): the
    # account, partition and time limit every job of this cluster asks for, the container
    # image its jobs run in, and mounts (SOURCE[:DESTINATION[:FLAGS]]) every container gets.
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    # Not a file's key: True when the network and peaks are the H100 file's, lent to a recipe
    # that names no cluster file (`recipe_cluster`): a precision those GPUs lack (FP4) then has
    # no peak to time by, rather than a refusal of a cluster the user never chose.
    peaks_assumed: bool = False

    @property
    def gpu_memory_bytes(self) -> float:
        return self.gpu_memory_gb * 1e9


_NUMBERS = ("nodes", "gpus_per_node", "gpu_memory_gb", "intra_node_gb_per_s",
            "inter_node_gb_per_s")
SITE_TEXT = ("account", "partition", "time", "container_image")  # site settings, as text
OPTIONAL = ("host_memory_gb", "device", "cpus_per_task", "exclusive", "gemm_peak_fraction",
            "gemm_half_dim", "collective_latency_us", "kernel_overhead_us", "host_cores",
            *SITE_TEXT, "container_mounts")
DEVICES = ("gpu", "cpu")
# Slurm's time limit forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch --time).
SLURM_TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})")


def slurm_time_problem(key: str, value: str | None) -> str | None:
    """A Slurm time limit in one of sbatch's forms (`04:00:00`, `2-00:00:00`, `90`)."""
    if value is None or SLURM_TIME.fullmatch(str(value).strip()):
        return None
    return (f"{key}={value!r} is not a Slurm time limit; write HH:MM:SS (e.g. 04:00:00), "
            "D-HH:MM:SS or minutes")


def mount_problem(where: str, mount: Any) -> str | None:
    """A container mount is `SOURCE[:DESTINATION[:FLAGS]]` with absolute paths (pyxis's
    `--container-mounts` form); None when it is."""
    parts = mount.split(":") if isinstance(mount, str) else []
    if len(parts) in (1, 2, 3) and all(part.startswith("/") for part in parts[:2]):
        return None
    return (f"{where}: container mount {mount!r} must be SOURCE[:DESTINATION[:FLAGS]] with "
            "absolute paths, e.g. /lustre/data:/lustre/data or /lustre/data:/data:ro")


def _site_settings(path: str, data: dict) -> dict:
    """The Slurm site settings of a cluster file, checked: text, a time limit, a mount list."""
    for key in SITE_TEXT:
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            raise ConfigError(f"{path}: {key}={data[key]!r} must be text, e.g. {key}: "
                              f"{'04:00:00' if key == 'time' else 'NAME'}")
    problem = slurm_time_problem(f"{path}: time", data.get("time"))
    mounts = data.get("container_mounts", [])
    if not isinstance(mounts, list):
        problem = problem or (f"{path}: container_mounts must be a list of "
                              "SOURCE[:DESTINATION[:FLAGS]], e.g. [/lustre:/lustre]")
    for mount in mounts if isinstance(mounts, list) else []:
        problem = problem or mount_problem(path, mount)
    if problem:
        raise ConfigError(problem)
    return {"container_mounts": tuple(mounts)} if "container_mounts" in data else {}


# Shares of a peak: a fraction of it, never more than all of it.
_FRACTIONS = ("gemm_peak_fraction",)


def _check_number(path: str, key: str, value: Any) -> None:
    integral = key in ("nodes", "gpus_per_node", "cpus_per_task", "host_cores")
    ok = isinstance(value, int) if integral else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive whole number" if integral else "a positive finite number"
        raise ConfigError(f"{path}: {key}={value!r} must be {kind}")
    if key in _FRACTIONS and value > 1:
        raise ConfigError(f"{path}: {key}={value!r} is a share of the peak, at most 1 "
                          "(e.g. 0.7); measure it with plan.py calibrate=true on a node")


def _check_keys(path: str, data: dict) -> None:
    known = [f.name for f in dataclasses.fields(ClusterSpec) if f.name != "peaks_assumed"]
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(known)}"
            raise ConfigError(f"{path}: unknown key '{key}'; {hint}")
    for key in known:
        if key not in data and key not in OPTIONAL:
            raise ConfigError(f"{path}: '{key}' is missing; add it (see conf/cluster/*.yaml)")


def gemm_precision(cfg: Any) -> str:
    """The precision this run's GEMMs compute in, the `peak_tflops` key that the planner's
    step time and the trainer's MFU divide by: the one a plugin sets (FP8, FP4), else the
    run's dtype."""
    return cfg.plugins.gemm_precision() or cfg.precision.dtype


def gemm_peak_tflops(cfg: Any, cluster: ClusterSpec) -> float | None:
    """Peak dense TFLOP/s per GPU of the GEMMs as this run computes them (`gemm_precision`);
    a cluster file whose GPUs have no such peak (FP4 before Blackwell) is refused in one line;
    the peaks lent to a recipe without a cluster file (`peaks_assumed`) give None: the time is
    then unknown, not refused."""
    precision = gemm_precision(cfg)
    if precision not in cluster.peak_tflops and cluster.peaks_assumed:
        return None
    if precision not in cluster.peak_tflops:
        raise ConfigError(f"cluster {cluster.name} gives no peak_tflops.{precision}: its GPUs run "
                          f"no {precision.upper()} GEMMs; plan on a cluster file of GPUs that do "
                          f"(add peak_tflops.{precision}) or change the run's precision")
    return cluster.peak_tflops[precision]


def _peak(path: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict) or not set(PRECISIONS) <= set(value) <= {
            *PRECISIONS, *OPTIONAL_PRECISIONS}:
        raise ConfigError(f"{path}: peak_tflops must give TFLOP/s for each of "
                          f"{', '.join(PRECISIONS)} (and {', '.join(OPTIONAL_PRECISIONS)} where "
                          "the GPUs have it)")
    for key, number in value.items():
        _check_number(path, f"peak_tflops.{key}", number)
    return {key: float(number) for key, number in value.items()}


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and check a cluster file; a missing file or bad key is one ConfigError line."""
    file = Path(path)
    if not file.is_file():
        found = sorted(p.name for p in CLUSTER_DIR.glob("*.yaml"))
        what = not_a_file(path)
        raise ConfigError(f"cluster={path} {what}; use one of conf/cluster/"
                          f"{{{','.join(found)}}}" if found else f"cluster={path} {what}")
    data = read_yaml(file, f"cluster={path}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping of keys to values (see conf/cluster/)")
    _check_keys(str(path), data)
    if not isinstance(data["name"], (str, int)) or not str(data["name"]).strip():
        raise ConfigError(f"{path}: name={data['name']!r} must be text, e.g. name: my_cluster")
    not_numbers = ("device", "exclusive", *SITE_TEXT, "container_mounts")
    for key in (*_NUMBERS, *(k for k in OPTIONAL if k not in not_numbers)):
        if key in data:
            _check_number(str(path), key, data[key])
    if data.get("device", "gpu") not in DEVICES:
        raise ConfigError(f"{path}: device={data['device']!r} must be gpu or cpu")
    if "host_cores" in data and data.get("device", "gpu") != "cpu":
        raise ConfigError(f"{path}: host_cores={data['host_cores']!r} is for CPU ranks; add "
                          "device: cpu or remove host_cores")
    if not isinstance(data.get("exclusive", False), bool):
        raise ConfigError(f"{path}: exclusive={data['exclusive']!r} must be true or false")
    if data["attention"] not in ("flash", "explicit"):
        raise ConfigError(f"{path}: attention={data['attention']!r} must be flash or explicit")
    return ClusterSpec(**{**data, "name": str(data["name"]),
                          "peak_tflops": _peak(str(path), data["peak_tflops"]),
                          **_site_settings(str(path), data)})


def recipe_cluster(cfg: Any, network_of: ClusterSpec | None = None) -> ClusterSpec:
    """The recipe's own `cluster` section as a spec (memory from `cluster.gpu_memory_gib`);
    bandwidths and peaks from `network_of`, else from the recipe's `cluster.spec` file, else
    lent by the H100 file (`peaks_assumed`)."""
    c = cfg.cluster
    assumed = network_of is None and not c.spec
    base = network_of or load_cluster(c.spec or CLUSTER_DIR / "h100_80gb_8x8.yaml")
    return dataclasses.replace(base, name=f"recipe ({base.name} network)", nodes=c.nodes,
                               gpus_per_node=c.gpus_per_node,
                               gpu_memory_gb=c.gpu_memory_gib * 2**30 / 1e9,
                               peaks_assumed=assumed)


def apply_cluster(cfg: Any, cluster: ClusterSpec) -> Any:
    """The config on this cluster's nodes: same world size, the cluster's GPUs per node (a world
    smaller than a node uses part of one node)."""
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    if world < cluster.gpus_per_node:  # part of one node
        cluster = dataclasses.replace(cluster, gpus_per_node=world)
    if world % cluster.gpus_per_node:
        raise ConfigError(
            f"the recipe's {world} ranks do not fill nodes of {cluster.gpus_per_node} GPUs "
            f"({cluster.name}); change cluster.nodes or pick another cluster file")
    nodes = world // cluster.gpus_per_node
    new_cluster = dataclasses.replace(cfg.cluster, nodes=nodes,
                                      gpus_per_node=cluster.gpus_per_node,
                                      gpu_memory_gib=cluster.gpu_memory_gb * 1e9 / 2**30)
    return dataclasses.replace(cfg, cluster=new_cluster)


GPU_MEMORY_KEY = "cluster.gpu_memory_gib"


def memory_given(rest: Any) -> bool:
    """Whether the command line sets `cluster.gpu_memory_gib=` itself (the recipe's own value
    does not count: a cluster file's memory wins over a recipe's)."""
    return any(str(arg).partition("=")[0].strip() == GPU_MEMORY_KEY for arg in rest)


def given_gpu_memory(cluster: ClusterSpec, cfg: Any, rest: Any) -> ClusterSpec:
    """The cluster file with the command line's `cluster.gpu_memory_gib=` as each GPU's memory:
    what is typed wins over a file, as every override wins over a recipe (a share of each GPU
    left to another process, or a smaller card of the same network). `cfg` is the config
    before `apply_cluster`, whose `cluster.gpu_memory_gib` is the typed value."""
    if not memory_given(rest):
        return cluster
    return dataclasses.replace(cluster, gpu_memory_gb=cfg.cluster.gpu_memory_gib * 2**30 / 1e9)

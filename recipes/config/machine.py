"""Is this machine (and this launch) able to run the recipe? Checked in well under a second.

GPUs are counted from the NVIDIA driver's device files, never by importing torch, so a wrong
machine is reported before any heavy import. Where GPUs are visible, their compute capability
comes from `nvidia-smi` and Transformer Engine's version from its installed metadata (no
import); each plugin config then says what it lacks on this machine (`machine_problem`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.protocol.errors import ConfigError
from recipes.config.schema import RunConfig, uses_transformer_engine

CPU_RANK_CAP = 16  # most local CPU processes the CPU runtime runs for one single-node recipe
_GPU_DEVICE = re.compile(r"nvidia\d+")


@dataclass(frozen=True, kw_only=True)
class MachineInfo:
    """What this process can use: local GPUs, and the world size a launcher gave it."""

    gpus: int  # GPUs visible to this process (after CUDA_VISIBLE_DEVICES)
    launched_world_size: int | None  # WORLD_SIZE from torchrun/srun; None = not launched
    compute_capability: tuple[int, int] | None = None  # lowest of the GPUs; None = unknown
    transformer_engine: str | None = None  # installed TE version ('unknown'); None = absent
    # Of mamba-ssm and causal-conv1d (a GPU rank's Mamba kernels), those not installed.
    missing_mamba_kernels: tuple[str, ...] = ()
    # The flex MoE dispatcher's libraries installed here: deepep, hybridep (DeepEP's).
    flex_backends: tuple[str, ...] = ()

    def transformer_engine_below(self, needed: str) -> bool:
        """Whether the installed Transformer Engine is parseably older than `needed`: an absent
        one is the TE check's, and 'unknown' or a local build's own version scheme is left to
        TE at run time."""
        from packaging.version import InvalidVersion, Version

        try:
            return self.transformer_engine is not None and (
                Version(self.transformer_engine) < Version(needed))
        except InvalidVersion:
            return False


MAMBA_KERNEL_PACKAGES = {"mamba_ssm": "mamba-ssm", "causal_conv1d": "causal-conv1d"}


def ranks_on_cpu(cluster: Any, gpus: int) -> bool:
    """Whether a run's ranks compute on CPU, launched from a machine with `gpus` GPUs:
    `cluster.device=cpu`, or `auto` on one node without GPUs. `auto` never turns a multi-node
    run into CPU ranks: a GPU node without GPUs is a broken allocation, refused in one line."""
    return cluster.device == "cpu" or (
        cluster.device == "auto" and gpus == 0 and cluster.nodes == 1)


def process_on_cpu(cluster: Any, cuda: bool) -> bool:
    """Whether this process (a rank, a dry run, a converter) computes on CPU: `cluster.device=
    cpu`, or `auto` where it has no CUDA device (a dry run of a 64-GPU recipe on a laptop
    too). A multi-node rank without GPUs never gets this far: `check_ranks` refuses it."""
    return cluster.device == "cpu" or (cluster.device == "auto" and not cuda)


def missing_mamba_kernels() -> tuple[str, ...]:
    return tuple(dist for module, dist in MAMBA_KERNEL_PACKAGES.items()
                 if importlib.util.find_spec(module) is None)


def count_gpus(
    dev_dir: Path = Path("/dev"),
    proc_gpus: Path = Path("/proc/driver/nvidia/gpus"),
    visible_devices: str | None = None,
) -> int:
    """NVIDIA GPUs from /dev/nvidiaN and the driver's /proc listing, limited by
    CUDA_VISIBLE_DEVICES (`visible_devices`) the way CUDA limits them."""
    physical = 0
    if dev_dir.is_dir():
        physical = sum(1 for p in dev_dir.iterdir() if _GPU_DEVICE.fullmatch(p.name))
    if proc_gpus.is_dir():
        physical = max(physical, sum(1 for _ in proc_gpus.iterdir()))
    if visible_devices is None:
        return physical
    visible = 0
    for entry in visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry
            break
        visible += 1
    return min(physical, visible)


def launched_world_size(environ: Mapping[str, str]) -> int | None:
    """WORLD_SIZE set by a launcher (torchrun, srun wrappers), or None when not launched."""
    raw = environ.get("WORLD_SIZE")
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"WORLD_SIZE='{raw}' is not an integer; unset it or launch with torchrun"
        ) from None


# What torch's env:// rendezvous reads besides LOCAL_RANK and WORLD_SIZE (torchrun sets all).
RENDEZVOUS_ENV = ("RANK", "MASTER_ADDR", "MASTER_PORT")


def half_launched_problem(environ: Mapping[str, str]) -> str | None:
    """LOCAL_RANK and WORLD_SIZE say this process is a launched rank, but what torch's env://
    rendezvous also reads is missing (a shell that exported some of torchrun's variables, a
    launcher wrapper that set only those): torch would fail with a ValueError traceback."""
    if "LOCAL_RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    missing = [name for name in RENDEZVOUS_ENV if not environ.get(name, "").strip()]
    port = environ.get("MASTER_PORT", "").strip()
    if not missing and port.isdigit():
        return None
    what = (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set" if missing
            else f"MASTER_PORT={port!r} is not a port number")
    return (f"LOCAL_RANK and WORLD_SIZE are set, so this process runs as one rank of a launched "
            f"run, but {what}; start it with torchrun (which sets them all), or unset "
            "LOCAL_RANK and WORLD_SIZE for the script to launch its own ranks")


def refuse_plain_srun(environ: Mapping[str, str]) -> None:
    """Several tasks of one `srun` step without torchrun would each self-launch a whole world.

    Plain srun sets SLURM_PROCID/SLURM_NTASKS but none of torchrun's RANK/WORLD_SIZE/LOCAL_RANK;
    the supported way under Slurm is one torchrun per node, which sets them.
    """
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if tasks.isdigit() and int(tasks) > 1 and not environ.get("WORLD_SIZE"):
        raise ConfigError(
            f"started by srun as {tasks} tasks without torchrun, so every task would launch a "
            "whole run; start one torchrun per node instead: srun --ntasks-per-node=1 torchrun "
            "--nnodes=$SLURM_NNODES --nproc-per-node=<GPUs per node> --rdzv-backend=c10d "
            "--rdzv-endpoint=<first node>:<free port> scripts/pretrain.py ..."
        )


def parse_compute_capabilities(nvidia_smi_output: str) -> tuple[int, int] | None:
    """The lowest `major.minor` in `nvidia-smi --query-gpu=compute_cap` output, or None."""
    found = [
        (int(major), int(minor))
        for major, minor in re.findall(r"^\s*(\d+)\.(\d+)\s*$", nvidia_smi_output, re.M)
    ]
    return min(found) if found else None


def gpu_compute_capability() -> tuple[int, int] | None:
    """Lowest compute capability of this node's GPUs from nvidia-smi (None when it cannot say;
    drivers before 510 lack the `compute_cap` query)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_capabilities(result.stdout) if result.returncode == 0 else None


def transformer_engine_version() -> str | None:
    """Installed Transformer Engine version from package metadata (as Megatron reads it,
    megatron/core/utils.py:315), 'unknown' for an importable copy without metadata, or None."""
    for distribution in ("transformer-engine", "transformer-engine-torch"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown" if importlib.util.find_spec("transformer_engine") else None


def flex_backends() -> tuple[str, ...]:
    """The flex dispatcher's backends importable here, as Megatron imports them
    (`transformer/moe/fused_a2a.py:10-16, 270-275`: `deep_ep.Buffer`, `deep_ep.HybridEPBuffer`),
    read from DeepEP's package source without importing it (no CUDA initialised)."""
    spec = importlib.util.find_spec("deep_ep")
    if spec is None:
        return ()
    found = ["deepep"]
    init = Path(spec.origin) if spec.origin else None
    if init is not None and init.is_file() and "HybridEPBuffer" in init.read_text(
            encoding="utf-8", errors="replace"):
        found.append("hybridep")
    return tuple(found)


def host_memory_bytes(cgroup_limit: Path = Path("/sys/fs/cgroup/memory.max")) -> int:
    """This machine's memory as a process here may use it: physical RAM, or the cgroup's
    limit when a container sets a lower one (what CPU ranks are planned against)."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = cgroup_limit.read_text().strip()
    except OSError:
        return physical
    return min(physical, int(limit)) if limit.isdigit() else physical


def detect_machine(environ: Mapping[str, str] | None = None) -> MachineInfo:
    """GPUs visible here, the launcher's world size and, with GPUs, their compute capability
    and Transformer Engine (no torch import)."""
    env = os.environ if environ is None else environ
    refuse_plain_srun(env)
    if problem := half_launched_problem(env):
        raise ConfigError(problem)
    gpus = count_gpus(visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
    return MachineInfo(
        gpus=gpus,
        launched_world_size=launched_world_size(env),
        compute_capability=gpu_compute_capability() if gpus else None,
        transformer_engine=transformer_engine_version() if gpus else None,
        missing_mamba_kernels=missing_mamba_kernels() if gpus else (),
        flex_backends=flex_backends() if gpus else (),
    )


def dry_run_command(cfg: RunConfig, command_args: Sequence[str] | None) -> str:
    """The command that inspects this configuration without GPUs."""
    args = [a for a in command_args or [f"recipe={cfg.name}"] if not a.startswith("dry_run=")]
    return "python scripts/pretrain.py " + shlex.join([*args, "dry_run=true"])


def check_machine(
    cfg: RunConfig, machine: MachineInfo, command_args: Sequence[str] | None = None,
    local_attention_cost: Callable[[RunConfig], str] | None = None,
) -> None:
    """Raise a one-line `ConfigError` if this machine/launch cannot run `cfg`.

    Multi-node recipes must be launched with a matching WORLD_SIZE on nodes with enough GPUs.
    Single-node recipes run on GPUs, or without CUDA on the CPU runtime (one local process per
    rank, at most CPU_RANK_CAP). Then each plugin says what it lacks here (FP8: CUDA,
    Transformer Engine, compute capability). `cfg.dry_run` skips the check. `command_args` (the
    user's arguments) make the suggested dry-run command reproduce their overrides;
    `local_attention_cost` (the planner's, `recipes/plan/fit.py`) says what the local layers'
    attention scores would cost where Transformer Engine is missing.
    """
    if cfg.dry_run:
        return
    check_ranks(cfg, machine, command_args)
    check_plugin_needs(cfg, machine)  # first: a plugin's need (FP8 on TE) says more
    check_transformer_engine(cfg, machine, local_attention_cost)
    check_mamba_kernels(cfg, machine)
    check_fast_path_kernels(cfg, machine)
    check_mamba_packed_context_parallel(cfg, machine)
    check_zero_centered_gamma_norm(cfg, machine)
    check_latent_moe_transformer_engine(cfg, machine)
    check_layernorm_recompute_on_fused_norms(cfg, machine)
    check_offload_in_graph_transformer_engine(cfg, machine)


def _te_layers_on_gpus(cfg: RunConfig, machine: MachineInfo) -> bool:
    return not ranks_on_cpu(cfg.cluster, machine.gpus) and uses_transformer_engine(
        cfg.model.transformer_impl, on_gpu=True)


def check_layernorm_recompute_on_fused_norms(cfg: RunConfig, machine: MachineInfo) -> None:
    """On Transformer Engine's layers the QKV and dense FC1 linears hold the norms, so
    `layernorm` recompute reaches only an MoE layer's own pre-MLP norm
    (`transformer/transformer_layer.py:450-456, 499-505`): on GPU ranks of a model without one
    it would recompute nothing. CPU ranks' local layers recompute every norm."""
    from recipes.config.fast_paths import has_moe_layers

    t = cfg.train
    if (t.recompute != "selective" or "layernorm" not in t.recompute_modules
            or has_moe_layers(cfg) or not _te_layers_on_gpus(cfg, machine)):
        return
    raise ConfigError(
        "train.recompute_modules has layernorm, but on GPU ranks Transformer Engine's QKV and "
        "FC1 linears hold the norms and the model has no MoE layer with a norm of its own "
        "(Megatron recomputes nothing); remove layernorm, or recompute mlp to free more")


# Lowest Transformer Engine for offloading inside a graph of attention (Megatron asserts it in
# every layer's constructor, transformer/transformer_layer.py:1495-1513).
OFFLOAD_IN_GRAPH_MIN_TE = "2.14.0"
OFFLOADED_IN_ATTENTION_GRAPH = ("qkv_linear", "core_attn", "attn_proj")


def check_offload_in_graph_transformer_engine(cfg: RunConfig, machine: MachineInfo) -> None:
    """Transformer Engine's graph of attention that holds an offloaded module needs TE 2.14."""
    t, found = cfg.train, machine.transformer_engine
    inside = [m for m in OFFLOADED_IN_ATTENTION_GRAPH if m in t.offload_modules]
    if (t.cuda_graphs != "transformer_engine" or "attn" not in t.cuda_graph_modules
            or not inside or not _te_layers_on_gpus(cfg, machine)
            or not machine.transformer_engine_below(OFFLOAD_IN_GRAPH_MIN_TE)):
        return
    raise ConfigError(
        f"train.offload_modules has {inside[0]} inside Transformer Engine's graph of attention "
        f"(train.cuda_graph_modules has attn), which needs Transformer Engine >= "
        f"{OFFLOAD_IN_GRAPH_MIN_TE}, found {found}; upgrade Transformer Engine, or remove attn "
        f"from train.cuda_graph_modules or {inside[0]} from train.offload_modules")


def check_latent_moe_transformer_engine(cfg: RunConfig, machine: MachineInfo) -> None:
    """A latent MoE's projections are Transformer Engine linears, whatever the layer spec, and
    Megatron asserts TE for them (`transformer/moe/moe_layer.py:264-289`); CPU ranks get the
    CPU runtime's torch ones, GPU ranks need TE installed."""
    if cfg.model.moe_latent_size is None or ranks_on_cpu(cfg.cluster, machine.gpus) or (
            machine.transformer_engine is not None):
        return
    raise ConfigError(
        f"model.moe_latent_size={cfg.model.moe_latent_size} builds its latent projections with "
        "Transformer Engine on GPU ranks, which is not installed here; install the gpu extra "
        "(pip install -e '.[gpu]'), or set model.moe_latent_size=null (a different model)")


def check_zero_centered_gamma_norm(cfg: RunConfig, machine: MachineInfo) -> None:
    """LayerNorm1p exists in Transformer Engine's norms only: CPU ranks build Megatron's local
    torch norm, which asserts against it (`transformer/torch_norm.py:44-46`). GPU ranks on local
    layers are the config rule's (`recipes/models/gpt/rules.py`)."""
    if not cfg.model.layernorm_zero_centered_gamma or not ranks_on_cpu(cfg.cluster,
                                                                       machine.gpus):
        return
    raise ConfigError(
        "model.layernorm_zero_centered_gamma=true needs Transformer Engine's norms on GPU ranks, "
        "but this run's ranks are on CPU, whose torch norms refuse it; run on GPUs, or set "
        "model.layernorm_zero_centered_gamma=false (a different model)")


def check_mamba_packed_context_parallel(cfg: RunConfig, machine: MachineInfo) -> None:
    """Megatron's Mamba CP reorders a packed row's tokens with Transformer Engine's
    `thd_get_partitioned_indices` and asserts TE >= 1.10 (`ssm/mamba_context_parallel.py:
    377-380`): refused before launch where the ranks run without TE (CPU ranks, local layers)."""
    has_mamba = "M" in (cfg.model.hybrid_layer_pattern or "")
    if not (has_mamba and cfg.parallel.context > 1 and cfg.data.packed_rows):
        return
    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    if not on_cpu and machine.transformer_engine is not None and (
            uses_transformer_engine(cfg.model.transformer_impl, on_gpu=True)):
        return
    raise ConfigError(
        f"data.documents={cfg.data.documents} (packed rows) with parallel.context="
        f"{cfg.parallel.context} and Mamba layers needs Transformer Engine on GPU ranks "
        "(Megatron's Mamba CP splits packed rows with it); set parallel.context=1, or "
        "data.documents=concatenate, or run on GPUs with the gpu extra")


def check_mamba_kernels(cfg: RunConfig, machine: MachineInfo) -> None:
    """A hybrid model's Mamba layers on GPU ranks call mamba-ssm's and causal-conv1d's CUDA
    kernels (`ssm/mamba_mixer.py:61-80`; the torch ones are the CPU runtime's): refused before
    launch without them rather than failing in every rank's model build."""
    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    if on_cpu or "M" not in (cfg.model.hybrid_layer_pattern or "") or (
            not machine.missing_mamba_kernels):
        return
    raise ConfigError(
        f"model.hybrid_layer_pattern has Mamba layers, which on GPUs need "
        f"{' and '.join(machine.missing_mamba_kernels)}, not installed here; install the gpu "
        "extra (pip install -e '.[gpu]', docs/hybrid-models.md)")


# Lowest Transformer Engine for a fused MoE kernel (Megatron: fused permutation needs TE 2.1,
# transformer_config.py:2651-2667; fused routing TE 2.7, :915-918).
FUSED_MOE_MIN_TE = {"moe_permute_fusion": "2.1", "moe_router_fusion": "2.7"}


def check_fast_path_kernels(cfg: RunConfig, machine: MachineInfo) -> None:
    """GPU ranks on Transformer Engine's layers need the kernels their fast paths call: the flex
    dispatcher's DeepEP or HybridEP, and a TE recent enough for the fused MoE kernels. CPU ranks
    run without them (the plan line names what is off)."""

    m = cfg.model
    if not m.num_moe_experts or not _te_layers_on_gpus(cfg, machine):
        return
    if m.moe_token_dispatcher == "flex" and m.moe_flex_backend not in machine.flex_backends:
        raise ConfigError(
            f"model.moe_token_dispatcher=flex with model.moe_flex_backend={m.moe_flex_backend} "
            f"needs DeepEP's {'HybridEP ' if m.moe_flex_backend == 'hybridep' else ''}kernels, "
            "which are not installed here; install DeepEP (docs/fast-paths.md) or set "
            "model.moe_token_dispatcher=alltoall")
    for name, needed in FUSED_MOE_MIN_TE.items():
        if getattr(m, name) and machine.transformer_engine_below(needed):
            raise ConfigError(f"model.{name}=true needs Transformer Engine >= {needed}, found "
                              f"{machine.transformer_engine}; upgrade Transformer Engine or set "
                              f"model.{name}=false")


def check_transformer_engine(
    cfg: RunConfig, machine: MachineInfo,
    local_attention_cost: Callable[[RunConfig], str] | None = None,
) -> None:
    """GPU ranks build Transformer Engine's layers unless told otherwise: a GPU node without TE
    would otherwise fall back to the local layers silently (unfused attention keeping every
    score, whose memory `local_attention_cost` states; sequence-parallel recipes die in the
    norm). CPU ranks cannot run TE's layers."""
    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    impl = cfg.model.transformer_impl
    if on_cpu and impl == "transformer_engine":
        raise ConfigError("model.transformer_impl=transformer_engine needs GPU ranks, but this "
                          "run's ranks are on CPU (no GPU here); use model.transformer_impl=auto")
    if not on_cpu and uses_transformer_engine(impl, on_gpu=True) and (
            machine.transformer_engine is None):
        cost = f": {local_attention_cost(cfg)}" if local_attention_cost else ""
        raise ConfigError(
            f"model.transformer_impl={impl} builds Transformer Engine's layers on GPUs, but "
            "Transformer Engine is not installed here; install the gpu extra (pip install -e "
            "'.[gpu]', docs/precision.md), or run Megatron Core's local layers with "
            f"model.transformer_impl=local (unfused attention that keeps every score{cost}; "
            "no FP8, no packed THD)")


def check_plugin_needs(cfg: RunConfig, machine: MachineInfo) -> None:
    """The first plugin (registry order) that finds this machine lacking raises its line."""
    on_cpu = ranks_on_cpu(cfg.cluster, machine.gpus)
    for _, plugin_config in cfg.plugins.configs():
        if problem := plugin_config.machine_problem(cfg, machine, on_cpu):
            raise ConfigError(problem)


def check_ranks(
    cfg: RunConfig, machine: MachineInfo, command_args: Sequence[str] | None = None
) -> None:
    """Enough GPUs (or CPU ranks) on this node for the recipe's world, launched consistently."""
    c, gpus, launched = cfg.cluster, machine.gpus, machine.launched_world_size
    world = c.world_size
    needs = (
        f"recipe {cfg.name} needs {world:,} GPUs: {c.nodes:,} node{'s' * (c.nodes != 1)} x "
        f"{c.gpus_per_node}, "
        f"{cfg.layout.describe()}"
    )
    hint = f"inspect it here with: {dry_run_command(cfg, command_args)}"
    found = f"found {gpus} GPU{'' if gpus == 1 else 's'}"
    if launched is not None and launched != world:
        raise ConfigError(f"{needs}; this process was launched with WORLD_SIZE={launched}; {hint}")
    on_cpu = ranks_on_cpu(c, gpus)
    if c.nodes > 1:
        if launched is None:
            raise ConfigError(
                f"{needs}; {found} and no multi-node launch (WORLD_SIZE unset); {hint}"
            )
        if not on_cpu and gpus < c.gpus_per_node:
            launch = " of a multi-node launch" if gpus == 0 else ""
            raise ConfigError(
                f"{needs}; {found} on this node{launch}, {c.gpus_per_node} needed; {hint}"
            )
        return
    if on_cpu:
        if world > CPU_RANK_CAP:
            raise ConfigError(
                f"{needs}; {found}, and the CPU runtime runs at most {CPU_RANK_CAP} local "
                f"ranks; {hint}"
            )
        return
    if gpus < world:
        off = " and cluster.device=gpu" if gpus == 0 else ""
        raise ConfigError(f"{needs}; {found}{off}; {hint}")

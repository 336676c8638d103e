"""A checkpoint Megatron-LM or Megatron Bridge wrote, read without torch before any rank starts.

Their `torch_dist` checkpoints hold the same tensors as this project's (the same Megatron Core
saves them); what differs is the bookkeeping beside them. Megatron-LM keeps the run's counters
and its whole command line in the common state (`args`, an `argparse.Namespace`: the consumed
samples, the parallel sizes, the model's shape), the step as `iteration`, the schedule as
`opt_param_scheduler`, and each rank's RNG streams over the PP x TP grid
(`megatron/training/checkpointing.py:398-465, 1296-1377`). Megatron Bridge writes the same
common state without `args`, and its counters and config as `train_state.pt` and
`run_config.yaml` beside the step (`format.py` names them).

This module reads that bookkeeping in the launching process without torch and without running
any pickled code: torch DCP's `.metadata` index and the common state's bytes are unpickled by a
restricted unpickler that builds plain containers and numbers and turns every class into an
inert record of its arguments. The result is shaped as this project's `run.json`
(`manifest.py`), with the model, batch and schedule read back through the one flag table
(`recipes/config/megatron_args.py`), so the pre-flight refuses a model of another shape and
states a changed batch or lr exactly as it does for its own checkpoints.
"""

from __future__ import annotations

import functools
import io
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from trainer.checkpoint.format import (
    BRIDGE_RUN_CONFIG,
    BRIDGE_TRAIN_STATE,
    DCP_METADATA,
    MANIFEST_FILE,
)
from trainer.checkpoint.manifest import LAYOUT_KEYS, change_notes

COMMON_STATE = "common_state"  # Megatron Core's key of the common state (serialization.py:226)
RNG_STATE = "rng_state"
MEGATRON_LM = "Megatron-LM"
MEGATRON_BRIDGE = "Megatron Bridge"
# This project's own step without its run.json (an `iter_NNNNNNN` of checkpoint.format=
# megatron_lm copied without it): its own state (`run_state`) is in the common state.
OWN = "mcore-recipes"
# Containers the restricted unpickler builds as themselves; every other global is a Record.
PLAIN = {("builtins", name) for name in ("dict", "list", "tuple", "set", "frozenset", "int",
                                         "float", "bool", "str", "bytes", "complex")}
PLAIN |= {("collections", "OrderedDict")}


class Record:
    """What a pickled object of any class becomes: its class name, call arguments and state;
    nothing of the class runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def fields(self) -> dict[str, Any]:
        """An object's attributes (a dataclass's or a Namespace's state, or its keywords)."""
        if isinstance(self.state, dict):
            return self.state
        if isinstance(self.state, tuple) and self.state and isinstance(self.state[-1], dict):
            return self.state[-1]  # (None, slots) from __reduce_ex__ of a slotted class
        return dict(self.kwargs)


class _Unpickler(pickle.Unpickler):
    """Builds plain containers; any other global becomes a `Record` subclass of its name."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in PLAIN:
            return super().find_class(module, name)
        return type(name, (Record,), {"__module__": module})

    def persistent_load(self, pid: Any) -> Any:  # a tensor's storage: not read
        return None


def _unpickle(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _torch_saved(data: bytes) -> Any:
    """What `torch.save` wrote (a zip of `data.pkl` and tensor storages), tensors left out."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        return _unpickle(archive.read(name))


# What a damaged or foreign file raises in the restricted reader.
UNREADABLE = (OSError, StopIteration, KeyError, ValueError, EOFError, pickle.UnpicklingError,
              zipfile.BadZipFile, AttributeError, TypeError, IndexError)


def dcp_index(step_dir: Path) -> tuple[list[str], dict[str, tuple[str, int, int]]]:
    """torch DCP's index of a step (`.metadata`): every saved key, and where each byte object
    and tensor piece lies (key -> file, offset, length). Read once per file as it stands (a
    pre-flight asks for it from several checks; a large model's index runs to megabytes)."""
    path = step_dir / DCP_METADATA
    stat = path.stat()
    keys, where = _read_index(path.resolve(), stat.st_mtime_ns, stat.st_size)
    return list(keys), dict(where)


@functools.lru_cache(maxsize=8)
def _read_index(path: Path, mtime_ns: int, size: int
                ) -> tuple[list[str], dict[str, tuple[str, int, int]]]:
    """`dcp_index` of one `.metadata` file; its time and size key the cache, so a file
    rewritten is read again."""
    metadata = _unpickle(path.read_bytes()).fields()
    where = {}
    for key, info in metadata["storage_data"].items():
        at = info.fields()
        where[key.fields()["fqn"]] = (at["relative_path"], at["offset"], at["length"])
    return list(metadata["state_dict_metadata"]), where


def unchecked_damage(step_dir: Path) -> str | None:
    """What torch DCP would meet as a traceback in every rank (`EOFError`, `UnpicklingError`,
    `FileNotFoundError` in `FileSystemReader`), found from the step's own index for a step
    without `run.json` (Megatron-LM's, Megatron Bridge's): its `.metadata` unreadable, a file
    the index names missing or shorter than the bytes it places there. None: whole as far as
    sizes tell (bytes changed in place stay unseen: no checksums are recorded)."""
    try:
        _, where = dcp_index(step_dir)
    except UNREADABLE:
        return f"{step_dir.name}/{DCP_METADATA} cannot be read (cut short or damaged)"
    ends: dict[str, int] = {}
    for file, offset, length in where.values():
        ends[file] = max(ends.get(file, 0), offset + length)
    for file, end in sorted(ends.items()):
        path = step_dir / file
        if not path.is_file():
            return f"{step_dir.name}/{file} is missing (its index places data there)"
        size = path.stat().st_size
        if size < end:
            return f"{step_dir.name}/{file} is cut short ({size} of at least {end} bytes)"
    return None


def saved_keys(step_dir: Path) -> list[str]:
    """Every key the step's index names (tensor and object keys)."""
    return dcp_index(step_dir)[0]


def read_object(step_dir: Path, at: tuple[str, int, int]) -> Any:
    """One byte object of the checkpoint (the common state, an RNG shard), unpickled inertly."""
    file, offset, length = at
    with open(step_dir / file, "rb") as f:
        f.seek(offset)
        return _torch_saved(f.read(length))


def common_state(step_dir: Path, where: dict[str, tuple[str, int, int]]) -> dict | None:
    """The common state Megatron Core saved once for all ranks (None: unreadable)."""
    try:
        key = next(k for k in where if k.startswith(f"{COMMON_STATE}/"))
        loaded = read_object(step_dir, where[key])
    except UNREADABLE:
        return None
    common = loaded[0] if isinstance(loaded, list) and loaded else loaded
    return common if isinstance(common, dict) else None


_SHARD = re.compile(r"^rng_state/shard_([\d.]+)_([\d.]+)$")


def rng_grid(keys: list[str]) -> tuple[int, ...] | None:
    """The grid the saved RNG streams are sharded over, from their keys
    (`rng_state/shard_<offsets>_<shape>`): `(world,)` this project's, `(PP, TP)` Megatron-LM's,
    `(PP, TP, DP)` Megatron Bridge's with experts; None without RNG streams."""
    for key in keys:
        match = _SHARD.match(key)
        if match:
            return tuple(int(n) for n in match.group(2).split("."))
    return None


def _namespace(value: Any) -> dict[str, Any]:
    return value.fields() if isinstance(value, Record) else dict(value or {})


def _nested(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in flat.items():
        section, name = dotted.split(".")
        nested.setdefault(section, {})[name] = value[0] if (
            isinstance(value, list) and len(value) == 1) else value
    return nested


def config_from_args(args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run config Megatron-LM's saved arguments describe, field by field through the one
    flag table (only the fields it carries and the arguments hold; None is a value, e.g. no
    experts), nested as `run.json` keeps it; empty when they hold a choice the project has no
    value for (the load then meets Megatron's own checks)."""
    from plugins.protocol.errors import ConfigError
    from recipes.config.megatron_args import ALWAYS_ON, FLAGS, SPELLED, from_megatron_values

    wanted = {f.dest for f in FLAGS} | {d for s in SPELLED for d in s.dests}
    defaults = {dest: None for dest in wanted}  # an older Megatron-LM may lack a flag
    defaults.update({dest: False for _, dest, _ in ALWAYS_ON})
    values = {**defaults, **args, "__given__": frozenset(args)}
    try:
        flat = from_megatron_values(values)
    except (ConfigError, KeyError, TypeError, ValueError):
        return {}
    absent = {f.field for f in FLAGS if f.dest not in args}
    return _nested({key: value for key, value in flat.items() if key not in absent})


# Megatron Bridge's run config names these as this project's fields (its model provider
# mirrors TransformerConfig, its optimizer Megatron Core's OptimizerConfig).
BRIDGE_FIELDS = {
    "model": {name: f"model.{name}" for name in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
        "num_query_groups", "kv_channels", "seq_length", "hybrid_layer_pattern",
        "mamba_state_dim", "mamba_head_dim", "mamba_num_heads", "mamba_num_groups",
        "num_moe_experts", "moe_ffn_hidden_size", "share_embeddings_and_output_weights",
        "add_bias_linear", "normalization", "make_vocab_size_divisible_by",
        "attention_softmax_in_fp32")},
    "train": {"global_batch_size": "train.global_batch_size",
              "micro_batch_size": "train.micro_batch_size", "train_iters": "train.train_iters"},
    "optimizer": {"lr": "optimizer.lr", "min_lr": "optimizer.min_lr",
                  "weight_decay": "optimizer.weight_decay",
                  "use_distributed_optimizer": "optimizer.distributed"},
}


def config_from_bridge(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fields of a Megatron Bridge run config that this project's config names alike."""
    flat = {}
    for section, names in BRIDGE_FIELDS.items():
        part = config.get(section)
        if not isinstance(part, dict):
            continue
        flat.update({ours: part[theirs] for theirs, ours in names.items()
                     if part.get(theirs) is not None})
    return _nested(flat)


def _bridge_parallel(config: dict[str, Any]) -> dict[str, Any]:
    """A Bridge run config's parallel sizes, as Megatron-LM's argument names."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    names = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size")
    return {name: model.get(name) for name in names}


def _layout(args: dict[str, Any]) -> dict[str, int]:
    """The saving run's layout as `run.json` records it (only the sizes the tool kept: Megatron
    Bridge's run config has no DP size)."""
    names = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
             "vpp": "virtual_pipeline_model_parallel_size", "cp": "context_parallel_size",
             "ep": "expert_model_parallel_size", "dp": "data_parallel_size"}
    return {key: int(args.get(names[key]) or 1) for key in LAYOUT_KEYS if names[key] in args}


def _sharding_type(common: dict[str, Any]) -> str | None:
    metadata = common.get("content_metadata") or {}
    return metadata.get("distrib_optim_sharding_type") if isinstance(metadata, dict) else None


def bridge_counters(step_dir: Path) -> dict[str, Any]:
    """Megatron Bridge's `train_state.pt`: its scalar tensors' values (step, consumed samples),
    read from the archive's storages."""
    try:
        data = (step_dir / BRIDGE_TRAIN_STATE).read_bytes()
    except OSError:
        return {}
    return _scalars(data)


def _scalars(data: bytes) -> dict[str, Any]:
    """A `torch.save`d dict of scalar tensors and numbers as numbers, without torch."""
    import struct

    kinds = {"LongStorage": "<q", "IntStorage": "<i", "FloatStorage": "<f",
             "DoubleStorage": "<d", "BoolStorage": "<?"}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        root = pkl[: -len("data.pkl")]

        class Scalars(_Unpickler):
            def persistent_load(self, pid: Any) -> Any:
                _, storage, key, *_ = pid
                kind = kinds.get(getattr(storage, "__name__", ""))
                raw = archive.read(f"{root}data/{key}")
                return None if kind is None else struct.unpack_from(kind, raw)[0]

        loaded = Scalars(io.BytesIO(archive.read(pkl))).load()
    found = {}
    for name, value in (loaded.items() if isinstance(loaded, dict) else ()):
        if isinstance(value, Record):  # _rebuild_tensor_v2(storage value, offset, size, ...)
            value = value.args[0] if value.args else None
        found[name] = value
    return found


def _bridge_config(step_dir: Path) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load((step_dir / BRIDGE_RUN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        return {}
    return loaded if isinstance(loaded, dict) else {}


def writer_of(step_dir: Path, common: dict[str, Any]) -> str | None:
    """Who wrote a step without `run.json`: Megatron-LM, Megatron Bridge, or this project (`OWN`:
    its own state is there, its `run.json` is not); None with a `run.json` (the manifest
    describes the step) or when it cannot tell."""
    if (step_dir / MANIFEST_FILE).is_file():
        return None
    if "run_state" in common:
        return OWN
    if "args" in common:
        return MEGATRON_LM
    if (step_dir / BRIDGE_TRAIN_STATE).is_file() or "iteration" in common:
        return MEGATRON_BRIDGE
    return None


def foreign_manifest(step_dir: Path) -> dict[str, Any] | None:
    """A step without `run.json`, described as this project's `run.json` describes its own (no
    file records; `writer` names the tool): Megatron-LM's, Megatron Bridge's, or this project's
    own that lost it (`OWN`: counters from its own state, config and layout from Megatron-LM's
    `args` where checkpoint.format=megatron_lm saved them); None for a step with a `run.json`
    or one whose common state cannot be read."""
    try:
        keys, where = dcp_index(step_dir)
    except UNREADABLE:
        return None
    common = common_state(step_dir, where)
    writer = writer_of(step_dir, common) if common is not None else None
    if writer is None:
        return None
    own = common.get("run_state") if writer == OWN else None
    own = own if isinstance(own, dict) else {}
    if writer in (MEGATRON_LM, OWN):
        args = _namespace(common.get("args"))
        consumed, config = args.get("consumed_train_samples"), config_from_args(args)
        consumed = own.get("consumed_samples", consumed)
    else:
        bridge = _bridge_config(step_dir)
        args, config = _bridge_parallel(bridge), config_from_bridge(bridge)
        consumed = bridge_counters(step_dir).get("consumed_train_samples")
    if args.get("use_distributed_optimizer") is not None:
        config.setdefault("optimizer", {})["distributed"] = bool(
            args["use_distributed_optimizer"])
    sharding = _sharding_type(common)
    if sharding:
        config.setdefault("checkpoint", {})["optimizer_format"] = sharding
    return {
        "writer": writer, "step": int(own.get("step", common.get("iteration")) or 0),
        "consumed_samples": int(consumed or 0), "consumed_tokens": own.get("consumed_tokens"),
        "world_size": own.get("world_size", args.get("world_size")), "layout": _layout(args),
        "padded_vocab_size": args.get("padded_vocab_size"),
        "checkpoint_version": common.get("checkpoint_version"),
        "rng_grid": rng_grid(keys), "optimizer_saved": any(k.startswith("optimizer.")
                                                            for k in keys),
        "config": config, "files": {},
    }


def rng_matches(grid: tuple[int, ...] | None, pp: int, tp: int, dp: int, world: int) -> bool:
    """Whether this rank grid can take the saved RNG streams: this project's are per rank (the
    same world), Megatron-LM's per PP x TP position (DP replicas share them), Megatron Bridge's
    with experts per PP x TP x DP position."""
    if grid is None:
        return False
    return tuple(grid) in {1: ((world,),), 2: ((pp, tp),), 3: ((pp, tp, dp),)}.get(len(grid), ())


def _grid_text(grid: tuple[int, ...]) -> str:
    names = {1: ("ranks",), 2: ("PP", "TP"), 3: ("PP", "TP", "DP")}[len(grid)]
    return " x ".join(f"{name}{n}" for name, n in zip(names, grid, strict=True))


def rng_note(cfg, manifest: dict[str, Any]) -> str | None:
    """One line when the saved RNG streams cannot be restored on this run's grid."""
    grid = manifest.get("rng_grid")
    layout = cfg.layout
    if rng_matches(grid, layout.pipeline, layout.tensor, layout.data_parallel * layout.context,
                   layout.world_size):
        return None
    if grid is None:
        return ("RNG streams: the checkpoint holds none (saved with --no-save-rng); each rank's "
                "streams start from train.seed")
    return (f"RNG streams: saved over {_grid_text(tuple(grid))}, this run is PP"
            f"{layout.pipeline} x TP{layout.tensor}; each rank's streams start from train.seed "
            "(weights, optimizer, schedule and data position resume all the same)")


def foreign_resume_problem(cfg, manifest: dict[str, Any]) -> str | None:
    """Why a full resume of a Megatron-LM or Bridge step cannot continue in this run, or None."""
    if not manifest.get("optimizer_saved"):
        return ("it holds no optimizer state (saved with --no-save-optim); start from its "
                "weights with checkpoint.load_model_only=true")
    if cfg.phases and manifest.get("writer") != OWN:  # OWN keeps each phase's position
        return ("its data position is one stream of samples, and this run trains in phases "
                "(each with its own stream); drop phases, or start from its weights with "
                "checkpoint.load_model_only=true")
    return None


def own_resume_line(step_dir: Path, manifest: dict[str, Any]) -> str:
    """The `resuming from` line of this project's own step without its `run.json` (`OWN`):
    its counters, and which checks the missing file leaves out."""
    read = ("changes are read from its Megatron-LM arguments" if manifest.get("config")
            else "changes are not stated")
    return (f"resuming from {step_dir} (step {manifest['step']}, {manifest['consumed_samples']} "
            f"samples, {manifest['consumed_tokens']} loss tokens; saved by {OWN}, its "
            f"{MANIFEST_FILE} missing: files and tokenizer are not checked, {read})")


def foreign_notes(cfg, step_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """What a full resume of a step without `run.json` (Megatron-LM's, Bridge's, `OWN`)
    continues from and changes."""
    version = manifest.get("checkpoint_version")
    first = (f"resuming from {step_dir} (step {manifest['step']}, "
             f"{manifest['consumed_samples']} samples; written by {manifest['writer']}"
             f"{f', checkpoint version {version}' if version is not None else ''}; it records "
             "no loss-token count, so loss tokens are counted from this resume)")
    if manifest["writer"] == OWN:
        first = own_resume_line(step_dir, manifest)
    note = rng_note(cfg, manifest)
    rng = "RNG streams as said below" if note else "RNG streams restored"
    return [first, *change_notes(cfg, manifest, rng), *([note] if note else [])]

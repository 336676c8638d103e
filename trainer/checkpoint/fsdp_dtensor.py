"""Megatron FSDP's checkpoint format, `fsdp_dtensor`: torch DCP of the DTensors each rank holds.

Megatron FSDP (`optimizer.fsdp`) keeps its weights and optimizer state as DTensors sharded over
DP, and Megatron's `torch_dist` sharded state dicts cannot describe them (Megatron-LM saves
Megatron FSDP only as `fsdp_dtensor`, `megatron/training/arguments.py:1146-1147`). The save and
the load follow Megatron-LM's (`megatron/training/checkpointing.py`: `generate_state_dict` for
`fsdp_dtensor`, :1332-1364; `preprocess_fsdp_dtensor_state_dict`, :1380-1397; the load,
:1761-1810): each chunk's `state_dict_for_save_checkpoint()` and the optimizer's
`sharded_state_dict(metadata={'distrib_optim_sharding_type': 'fsdp_dtensor'})`, prepared by
Megatron Core's own helpers (FP8 extra state dropped, SwiGLU's fused fc1 and experts split into
global keys, uneven DTensor shards described), written by torch DCP; loaded into the same
template, then through `load_state_dict`. DCP reshards DTensors over DP, so a checkpoint resumes
at another DP size; other layout changes are refused before launch (`manifest.py`).

The export to Hugging Face reads its weights back in one process without a process group
(`stored_weights`, `weight_parts`, `read_weights`): DCP's reader gives any stored tensor whole,
from the chunks every rank wrote, whatever DP, TP or level wrote them. What the files hold, as
written here: the one chunk's weights (Megatron FSDP runs PP 1) under `model.module.` (the
wrapper's own prefix) with global layer and expert numbers, each at its global shape (Megatron
FSDP's flat, padded buffers are not what is stored: the uneven DTensor chunks are described as
rows of the tensor), SwiGLU's fc1 as Megatron FSDP splits it, `<name>_w` (gate) and `<name>_v`
(up), and the optimizer state under `optimizer.`, which the export does not read.

Beside DCP's files the run's own part is written as plain torch files, loaded weights-only:
`run_state.pt` (scheduler, run state and, with fp16, the loss scalers, which Megatron's
fsdp_dtensor optimizer dict lacks; rank 0) and `__<rank>_rng.pt` (each rank's streams, named as
DCP names a rank's shards, so `run.json` checksums each rank's own files), and Megatron's
`metadata.json` marker naming the backend, written last: a step directory without it is not a
checkpoint (`format.py`), and the pre-flight reads the format from it without torch.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from plugins.protocol.errors import ConfigError
from trainer.checkpoint import megatron_fixes
from trainer.checkpoint.format import DCP_METADATA, FSDP_DTENSOR
from trainer.state import RngState, RunState

RUN_STATE_FILE = "run_state.pt"
METADATA = {"distrib_optim_sharding_type": FSDP_DTENSOR, "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True}


def _rng_file(rank: int) -> str:
    return f"__{rank}_rng.pt"


def _model_key(index: int, chunks: int) -> str:
    return "model" if chunks == 1 else f"model{index}"


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _state_dict(session, *, loading: bool) -> dict:
    """The model chunks' and the optimizer's DTensor state dicts (what DCP writes and reads)."""
    model = session.model
    state = {_model_key(i, len(model)): chunk.state_dict_for_save_checkpoint()
             for i, chunk in enumerate(model)}
    if loading:
        megatron_fixes.create_state_if_missing(session.optimizer)
    else:
        megatron_fixes.optimizer_state_before_first_update(session.optimizer)
    megatron_fixes.empty_shard_optimizer_state(session.optimizer)
    state["optimizer"] = session.optimizer.sharded_state_dict(
        state, is_loading=loading, metadata=dict(METADATA))
    return state


def _prepared(cfg, model: list, state: dict) -> dict:
    """Megatron-LM's `preprocess_fsdp_dtensor_state_dict` (checkpointing.py:1380-1397) from
    Megatron Core's helpers, for each chunk: the prepared dict shares its tensors with `state`,
    so DCP's in-place load fills both."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_experts_in_state_dict,
        handle_fp8_extra_state_case,
        handle_swiglu_in_state_dict,
    )

    prepared = dict(state)
    optimizer = prepared.get("optimizer")
    for i, chunk in enumerate(model):
        key = _model_key(i, len(model))
        model_state = dict(prepared[key])
        handle_fp8_extra_state_case(model_state)
        if cfg.model.activation == "swiglu":
            model_state, optimizer = handle_swiglu_in_state_dict(
                megatron_fixes.swiglu_optimizer_keys(chunk), model_state, optimizer)
        if cfg.model.num_moe_experts:
            model_state = handle_experts_in_state_dict(model_state, cfg.model.num_moe_experts)
        prepared[key] = model_state
    if optimizer is not None:
        prepared["optimizer"] = optimizer
    preprocess_state_dict_for_uneven_dtensor(prepared)
    return prepared


def write(session, state: RunState, path: Path) -> None:
    """Every rank: DCP's shards of this rank's DTensors and its RNG streams; rank 0 the run
    state and scheduler. No collective after DCP's own: the save's phases share every rank's
    outcome (`disk_errors.run_phases`), and the marker is the phase after this one."""
    rank = torch.distributed.get_rank()
    with megatron_fixes.gc_frozen():
        prepared = _prepared(session.cfg, session.model, _state_dict(session, loading=False))
    dcp.save(prepared, storage_writer=dcp.FileSystemWriter(str(path)))
    rng = None if state.rng is None else state.rng.as_dict()
    torch.save(rng, path / _rng_file(rank))
    if rank == 0:
        torch.save({"scheduler": session.scheduler.state_dict(), "run_state": state.common(),
                    "grad_scalers": _grad_scaler_states(session.optimizer)},
                   path / RUN_STATE_FILE)


def _scalers(optimizer) -> list:
    """Each inner optimizer's fp16 loss scaler (None without one), in the chain's order."""
    return [inner.grad_scaler for inner in _inner_optimizers(optimizer)]


def _grad_scaler_states(optimizer) -> list:
    """The loss scalers' states, which Megatron keeps under `grad_scaler` in the other formats'
    optimizer dicts (`DistributedOptimizer.state_dict`, optimizer/distrib_optimizer.py:882-883)
    but not in fsdp_dtensor's (`sharded_param_state_fsdp_dtensor` holds only the parameters'
    state and groups, :1654; `load_state_dict` under Megatron FSDP returns before the scaler,
    :916-925): without them an fp16 resume restarts the scale. Every rank's scaler is the same
    (overflows are reduced over the ranks); the scale is kept on the CPU, so that the file
    loads without a GPU."""
    return [None if scaler is None else
            {key: value.cpu() if isinstance(value, torch.Tensor) else value
             for key, value in scaler.state_dict().items()}
            for scaler in _scalers(optimizer)]


def _restore_grad_scalers(optimizer, saved: list | None) -> None:
    """The saved loss scalers into this run's (as Megatron's `load_state_dict` does for the
    other formats, distrib_optimizer.py:1051-1060); a checkpoint without them, or a run or a
    checkpoint without fp16, leaves this run's scalers as they start."""
    for scaler, state in zip(_scalers(optimizer), saved or [], strict=False):
        if scaler is not None and state is not None:
            scaler.load_state_dict(state)


def write_marker(path: Path) -> None:
    """Rank 0, once every rank's files are written: Megatron's `metadata.json` naming the
    backend, the last file of the checkpoint (`format.is_checkpoint`)."""
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config

    if torch.distributed.get_rank() == 0:
        save_config(CheckpointingConfig(sharded_backend=FSDP_DTENSOR), str(path))


class _WeightsOnlyLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's planner with the non-tensor objects (the optimizer's param groups) unpickled by
    torch's restricted unpickler, as `megatron_fixes.weights_only_objects` does for torch_dist."""

    def load_bytes(self, read_item, value) -> None:
        megatron_fixes.load_bytes_weights_only(self, read_item, value)


def _read(template: dict, path: Path, *, partial: bool = False) -> None:
    """DCP's load into `template` in place; `partial`: the checkpoint may hold more (the
    optimizer state beside the weights a model-only load reads)."""
    dcp.load(template, storage_reader=dcp.FileSystemReader(str(path)),
             planner=_WeightsOnlyLoadPlanner(allow_partial_load=partial))


def _install_loaded_weights(model: list) -> None:
    """DCP loaded the weights in place into Megatron FSDP's DTensors, the high-precision main
    weights where there are any; the weights forward uses are made from them, as Megatron FSDP
    does after an optimizer step or a `load_state_dict` (megatron_fsdp.py:1136-1140, :1460)."""
    for chunk in model:
        chunk.module.install_optimized_model_weights()


def saved_world_size(path: Path) -> int:
    return int(_run_file(path)["run_state"]["world_size"])


def _run_file(path: Path) -> dict:
    return torch.load(path / RUN_STATE_FILE, weights_only=True)


def load(session, path: Path, hyperparameters: dict) -> RunState:
    """Restore weights, optimizer, scheduler and run state from an `fsdp_dtensor` checkpoint;
    each rank's RNG streams when the world size is the one that saved them."""
    state = _state_dict(session, loading=True)
    raw_optimizer = dict(state["optimizer"])
    with megatron_fixes.gc_frozen():
        _read(_prepared(session.cfg, session.model, state), path)
    _install_loaded_weights(session.model)
    megatron_fixes.adopt_hyperparameters(raw_optimizer, hyperparameters)
    session.optimizer.load_state_dict(raw_optimizer)
    megatron_fixes.give_each_param_its_own_step(session.optimizer)
    saved = _run_file(path)
    _restore_grad_scalers(session.optimizer, saved.get("grad_scalers"))
    session.scheduler.load_state_dict(saved["scheduler"])
    world_size, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    rng = None
    if int(saved["run_state"]["world_size"]) == world_size:
        values = torch.load(path / _rng_file(rank), weights_only=True)
        rng = None if values is None else RngState.from_dict(values)
    return RunState.from_common(saved["run_state"], rng)


def load_weights(cfg, path: Path, model: list) -> None:
    """Only the weights of an `fsdp_dtensor` checkpoint, into this run's Megatron FSDP chunks
    (`checkpoint.load_model_only`: a fresh optimizer)."""
    state = {_model_key(i, len(model)): chunk.state_dict_for_save_checkpoint()
             for i, chunk in enumerate(model)}
    _read(_prepared(cfg, model, state), path, partial=True)
    _install_loaded_weights(model)


# The export's reading (module doc): the weights under the one chunk's Megatron FSDP wrapper.
WEIGHTS_PREFIX = f"{_model_key(0, 1)}.module."
SWIGLU_HALVES = ("_w", "_v")  # handle_swiglu_in_state_dict's [gate; up] of a fused fc1


def _damaged(path: Path, error: BaseException) -> ConfigError:
    if isinstance(error, dcp.api.CheckpointException):  # DCP's wrapper: the reader's own error
        error = next(iter(error.failures.values()))[0]
    reason = f"{type(error).__name__}: {' '.join(str(error).split())}"[:300].rstrip()
    return ConfigError(f"checkpoint {path} ({FSDP_DTENSOR}) cannot be read: {reason}; its "
                       "files are damaged or incomplete: export another step")


def stored_weights(path: Path) -> dict:
    """State-dict name -> what DCP stores for it (global size, dtype), for the model's tensors
    only; one line when DCP's index is missing or unreadable."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except (OSError, EOFError, ValueError, RuntimeError, pickle.UnpicklingError,
            dcp.api.CheckpointException) as error:
        raise _damaged(path, error if (path / DCP_METADATA).is_file() else
                       FileNotFoundError(f"no {DCP_METADATA}")) from None
    return {key.removeprefix(WEIGHTS_PREFIX): stored
            for key, stored in metadata.state_dict_metadata.items()
            if key.startswith(WEIGHTS_PREFIX) and isinstance(stored, TensorStorageMetadata)}


def weight_parts(path: Path, name: str, stored: dict) -> list[str]:
    """The stored names holding state-dict name `name`, in row order: the name itself, or a
    SwiGLU fc1's halves [gate; up] as Megatron FSDP splits it; one line when neither is there."""
    if name in stored:
        return [name]
    halves = [f"{name}{half}" for half in SWIGLU_HALVES]
    if all(half in stored for half in halves):
        return halves
    raise ConfigError(f"checkpoint {path} ({FSDP_DTENSOR}) has no tensor {name}; it was not "
                      "written by a model of its config.yaml's shape")


def read_weights(path: Path, names: list[str], stored: dict) -> dict[str, torch.Tensor]:
    """Each stored name's whole global tensor, in the stored dtype: DCP reads, in this process
    alone, only the chunks of these tensors; one line when a file is missing or short."""
    targets = {name: torch.empty(tuple(stored[name].size), dtype=stored[name].properties.dtype)
               for name in names}
    try:
        dcp.load({WEIGHTS_PREFIX + name: tensor for name, tensor in targets.items()},
                 storage_reader=dcp.FileSystemReader(str(path)),
                 planner=_WeightsOnlyLoadPlanner(allow_partial_load=True), no_dist=True)
    except (OSError, EOFError, ValueError, RuntimeError, dcp.api.CheckpointException) as error:
        raise _damaged(path, error) from None
    return targets


def tensor_parallel_parts(tensor: torch.Tensor, rows: list[int], tensor_parallel: int) -> list:
    """A fused tensor whose parts TP splits each on its own (the Mamba mixer's in_proj [z; x; B;
    C; dt], conv1d [x; B; C]), stored whole: DCP's global tensor is the TP ranks' local tensors
    end to end, each [its rows of part 0; of part 1; ...]. The parts, each whole (`rows` its
    TP1 row counts, in order)."""
    if tensor_parallel == 1 or len(rows) == 1:
        return list(torch.split(tensor, rows))
    local = [count // tensor_parallel for count in rows]
    blocks = [torch.split(block, local) for block in torch.chunk(tensor, tensor_parallel)]
    return [torch.cat([block[k] for block in blocks]) for k in range(len(rows))]

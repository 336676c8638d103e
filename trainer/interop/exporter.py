"""Export: a Megatron checkpoint of any layout -> a Hugging Face model directory.

Why it needs no training session: the checkpoint's keys are global, so one process builds the
run's model on the meta device at TP1 (`megatron_side`) to learn where each weight is stored,
and reads the full tensors of one transformer layer at a time, in the dtype they were stored in,
whatever TP/PP/VPP/EP layout wrote them: from a `torch_dist` checkpoint through `region_reader`
(the layer's region of the stacked tensors), from Megatron FSDP's `fsdp_dtensor` through
`checkpoint/fsdp_dtensor.py` (the layer's tensors, whole, under their state-dict names). Each
layer is re-laid to Hugging Face's names (`mapping`), handed to size-limited safetensors shards,
and dropped: the peak is one layer plus the shard being filled. The model shape comes from the
run's `config.yaml` (next to the checkpoint, or two levels up in `runs/<run>/config.yaml`);
config.json keeps the fields of the imported model when the checkpoint is an import, or the run
started from one (its `checkpoint.load` holds `hf/config.json`), and its tokenizer files travel
along. A model trained here gets the tokenizer of its prepared data (named in one line) and, in
config.json and generation_config.json, its data's end-of-document id as EOS (`token_ids.py`),
so transformers' `generate` stops where the model learned to end a document. Every file gets the
same mode, and the directory is published by one rename.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch

from plugins.protocol.errors import ConfigError
from recipes.config.io import load_config
from recipes.config.schema import RunConfig
from trainer.checkpoint import fsdp_dtensor
from trainer.checkpoint.format import FSDP_DTENSOR, HF_IMPORT_SOURCE, checkpoint_backend
from trainer.checkpoint.manifest import read_manifest
from trainer.interop import (
    hf_config,
    hf_files,
    megatron_side,
    memory,
    region_reader,
    token_ids,
)
from trainer.interop.export_step import (
    checked_step,
    config_mismatch_line,
    resolve_step,
    run_config_file,
)
from trainer.interop.mapping import rules, shapes_of
from trainer.models.gpt.hf_tensors import Rule, Shapes, megatron_shape, to_hf

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class ExportResult:
    out: Path
    tensors: int
    bytes: int
    seconds: float
    peak_bytes: int  # weights held at once: the largest layer plus the shard being filled


def run_config(step: Path, given: Path | None = None) -> RunConfig:
    """The config of the run that wrote `step` (an imported checkpoint keeps one beside it);
    one line when there is none (`export_step.run_config_file`)."""
    path = run_config_file(step if given is None else given, step)
    cfg = load_config(path)
    mismatch = config_mismatch_line(step if given is None else given, step, path, cfg)
    if mismatch:
        raise ConfigError(mismatch)
    return cfg


def _by_layer(plan: list[Rule]) -> list[list[Rule]]:
    """One group per transformer layer (embedding, norm and head alone): the load unit."""
    def layer(rule: Rule) -> str:
        parts = rule.megatron.split(".")
        return ".".join(parts[:3]) if parts[:2] == ["decoder", "layers"] else rule.megatron

    return [list(group) for _, group in groupby(plan, key=layer)]


def _imported_files(step: Path, cfg: RunConfig) -> Path | None:
    """The `hf/` folder of the import this checkpoint is, or the run started from."""
    candidates = [step]
    if cfg.checkpoint.load:  # a run trained from an import: follow it
        candidates.append(Path(cfg.checkpoint.load))
    for folder in candidates:
        if (folder / HF_IMPORT_SOURCE / "config.json").is_file():
            return folder / HF_IMPORT_SOURCE
    return None


def _base_config(side: Path | None) -> dict | None:
    return json.loads((side / "config.json").read_text(encoding="utf-8")) if side else None


class _TorchDistLayers:
    """A `torch_dist` checkpoint's weights: each name's regions of the stored (stacked) tensors,
    in row order (`megatron_side.regions`), read by `region_reader`."""

    def __init__(self, step: Path) -> None:
        self.step = step
        self.stored = region_reader.stored_tensors(step)

    def dtype(self) -> torch.dtype:
        return next(iter(self.stored.values())).properties.dtype

    def read(self, names: list[str], where: dict) -> dict[str, list[torch.Tensor]]:
        wanted = {f"{name}#{k}": region for name in names for k, region in enumerate(where[name])}
        loaded = region_reader.read_regions(self.step, wanted, self.stored)
        return {name: [loaded[f"{name}#{k}"] for k in range(len(where[name]))] for name in names}


class _FsdpDtensorLayers:
    """Megatron FSDP's `fsdp_dtensor` checkpoint: each name's tensor whole, or a SwiGLU fc1 as
    its two halves (`fsdp_dtensor.weight_parts`); a fused tensor whose parts TP splits each on
    its own (the Mamba mixer's) is cut back into them by the TP that saved it."""

    def __init__(self, step: Path, tensor_parallel: int) -> None:
        self.step, self.tensor_parallel = step, tensor_parallel
        self.stored = fsdp_dtensor.stored_weights(step)

    def dtype(self) -> torch.dtype:
        if not self.stored:
            raise ConfigError(f"checkpoint {self.step} ({FSDP_DTENSOR}) holds no model weights")
        return next(iter(self.stored.values())).properties.dtype

    def read(self, names: list[str], where: dict) -> dict[str, list[torch.Tensor]]:
        parts = {name: fsdp_dtensor.weight_parts(self.step, name, self.stored) for name in names}
        loaded = fsdp_dtensor.read_weights(self.step, [p for ps in parts.values() for p in ps],
                                           self.stored)
        found = {}
        for name, stored in parts.items():
            regions = where[name]
            if len(stored) == len(regions):
                found[name] = [loaded[part] for part in stored]
                continue
            whole = loaded[stored[0]]
            row = whole[0].numel()  # one row's elements: a region's rows are its size / this
            rows = [math.prod(region.sizes) // row for region in regions]
            found[name] = fsdp_dtensor.tensor_parallel_parts(whole, rows, self.tensor_parallel)
        return found


def _layers(step: Path, cfg: RunConfig):
    """The reader of this checkpoint's weights, by the format its marker names (the TP that
    saved it from its `run.json`, else its config)."""
    if checkpoint_backend(step) != FSDP_DTENSOR:
        return _TorchDistLayers(step)
    layout = (read_manifest(step) or {}).get("layout") or {}
    return _FsdpDtensorLayers(step, int(layout.get("tp", cfg.parallel.tensor)))


def _write_layers(template, plan, shapes, layers, writer, progress) -> tuple:
    """Every layer into the writer; (dtype, bytes of the largest layer)."""
    where = megatron_side.regions(template)
    task = progress.add_task("export", total=len(plan))
    dtype, largest = None, 0
    for group in _by_layer(plan):
        loaded = layers.read([rule.megatron for rule in group], where)
        largest = max(largest, sum(t.numel() * t.element_size()
                                   for chunks in loaded.values() for t in chunks))
        for rule in group:
            tensor = _assembled(rule, loaded.pop(rule.megatron), shapes)
            dtype = dtype or tensor.dtype
            writer.add(zip(rule.hf, to_hf(rule, tensor, shapes), strict=True))
            progress.advance(task)
    return dtype, largest


def _assembled(rule: Rule, chunks: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    """The rule's TP1 tensor from its parts, read in row order (`megatron_side.regions`)."""
    shape = megatron_shape(rule, shapes)
    rows = [chunk.reshape(-1, *shape[1:]) for chunk in chunks]
    return (rows[0] if len(rows) == 1 else torch.cat(rows)).reshape(shape)


def _copy_tokenizer(cfg: RunConfig, side: Path | None, directory: Path,
                    console) -> hf_files.RunTokenizer | None:
    """An imported model's own files (tokenizer, generation config); else the tokenizer of the
    run's prepared data, said in one line (which one, and from which manifest); a byte-level
    run (no tokenizer file) exports none. The run's tokenizer, when one was written."""
    imported = hf_files.side_files(side) if side else []
    for path in imported:
        shutil.copy2(path, directory / path.name)
    trained = None if imported else hf_files.run_tokenizer(cfg.data.blend)
    if trained is not None:
        hf_files.write_tokenizer(trained.file, trained.eod_token, directory)
        console.print(f"tokenizer: {trained.file} (data.blend={cfg.data.blend}: manifest "
                      f"{trained.manifest}, end of document {trained.eod_token!r} = id "
                      f"{trained.eod_id})", soft_wrap=True)  # paths whole, never cut
    return trained


def run_eod_id(step: Path, cfg: RunConfig, trained: hf_files.RunTokenizer | None) -> int:
    """The end-of-document id the run trained with: its checkpoint's record of its tokenizer,
    else the manifest's, else the byte tokenizer's (the built-in corpora)."""
    from data_prep.byte_tokenizer import ByteTokenizer

    recorded = (read_manifest(step) or {}).get("tokenizer") or {}
    if isinstance(recorded.get("eod_id"), int):
        return recorded["eod_id"]
    if trained is not None and isinstance(trained.eod_id, int):
        return trained.eod_id
    return ByteTokenizer.eod


def _write_configs(config: dict, step: Path, cfg: RunConfig, side: Path | None,
                   trained: hf_files.RunTokenizer | None, tmp: Path) -> None:
    """config.json with the special token ids, and generation_config.json (`generate` reads
    it first): an imported model keeps its own ids and files; a model trained here gets its
    data's end-of-document id as EOS (trainer/interop/token_ids.py)."""
    if side is None:
        config.update(token_ids.special_ids(run_eod_id(step, cfg, trained),
                                            tmp if trained is not None else None))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if not (tmp / "generation_config.json").is_file():
        ids = {key: config.get(key) for key in token_ids.ID_KEYS}
        (tmp / "generation_config.json").write_text(
            json.dumps(token_ids.generation_config(ids), indent=2) + "\n")


def _check_against_model(template: dict, plan: list[Rule], shapes: Shapes) -> None:
    ours = {rule.megatron: megatron_shape(rule, shapes) for rule in plan}
    if ours != megatron_side.weight_shapes(template):
        raise RuntimeError("mapping and Megatron model disagree on names or shapes")


def export_hf(checkpoint: Path, out: Path, progress,
              max_shard_bytes: int = hf_files.DEFAULT_SHARD_BYTES,
              checked: bool = False) -> ExportResult:
    """Write the Hugging Face directory `out` from a checkpoint root or step (module doc); the
    step is first checked against its `run.json` (`export_step`) unless `checked` says the
    caller did."""
    started = time.perf_counter()
    hf_files.refuse_existing(out)
    step = resolve_step(checkpoint) if checked else checked_step(checkpoint)
    cfg = run_config(step, checkpoint)
    hf_config.check_exportable(cfg.model, f"the model of checkpoint {step}")
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    plan = rules(shapes)
    layers = _layers(step, cfg)
    progress.console.print(memory.estimate_line(
        "export", memory.export_peak(shapes, layers.dtype().itemsize, max_shard_bytes)))
    with megatron_side.one_process(cfg) as one:
        template = megatron_side.meta_template(one)
        _check_against_model(template, plan, shapes)
        tmp = hf_files.temporary_dir(out)
        try:
            writer = hf_files.ShardWriter(tmp, max_shard_bytes)
            dtype, largest = _write_layers(template, plan, shapes, layers, writer, progress)
            writer.finish()
            side = _imported_files(step, cfg)
            config = hf_config.hf_config_for(cfg.model, DTYPE_NAMES[dtype], _base_config(side))
            trained = _copy_tokenizer(cfg, side, tmp, progress.console)
            _write_configs(config, step, cfg, side, trained, tmp)
            hf_files.same_mode(tmp)  # safetensors writes 0600; every file alike
            hf_files.publish(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(out, sum(len(r.hf) for r in plan), writer.total_bytes,
                        time.perf_counter() - started,
                        largest + min(max_shard_bytes, writer.total_bytes))

"""Import: a Hugging Face Llama/Mixtral directory -> a Megatron checkpoint any layout loads.

Why this order: everything that can be wrong with the input (not a model, an unmapped
architecture, a recipe of another shape, a missing shard or tensor, a tensor of the wrong shape
or of an integer dtype, a tensor the mapping has no place for, a side file that is not valid
JSON) is checked from config.json and the shards' headers before a byte of weights is read or any
output exists; each shard whose download recorded a SHA-256 is hashed against it (`hf_digests`:
damage inside tensor data that no header shows). A tensor no mapping rule uses is refused,
not dropped: it means the weights are of another size than config.json (a layer more), which
transformers would report as unexpected; the names transformers itself skips on load are
skipped alike (`IGNORED_ON_LOAD`). Then the shards are read one at a time in file
order, each Hugging Face tensor re-laid into Megatron's (`mapping`), and written once as a
torch_dist checkpoint through the model's own sharded state dict (`megatron_side`), into a
temporary directory renamed at the end, with a `run.json` recording every file's CRC-32
(`import_manifest`), so pretrain.py and the export refuse a damaged import in one line as they
refuse a damaged step of a run. The checkpoint's tensors keep the Hugging Face dtype; the
loading run casts them to its own.

Memory: the source is read shard by shard, but one `dist_checkpointing.save` call needs every
tensor it writes, so the converted model is held once in its dtype (about 16 GB for Llama-3-8B
in bf16); `memory.import_peak` gives the figure from the model's shape before starting.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from plugins.protocol.errors import ConfigError
from recipes.config.io import save_config
from recipes.config.schema import RunConfig
from trainer.checkpoint.format import HF_IMPORT_SOURCE
from trainer.interop import (
    hf_config,
    hf_digests,
    hf_files,
    import_manifest,
    megatron_side,
    memory,
)
from trainer.interop.mapping import rules, shapes_of
from trainer.models.gpt.hf_tensors import Rule, Shapes, hf_shapes, megatron_shape, to_megatron


@dataclass
class ImportResult:
    out: Path
    tensors: int
    bytes: int
    seconds: float


@dataclass
class Source:
    """A checked Hugging Face directory: its config, its shards and the plan to convert it."""

    config: dict
    weights: hf_files.HFWeights
    shapes: Shapes
    plan: list[Rule]
    side: list[Path]  # its tokenizer and generation files, checked


# What transformers 5 skips on load without a word, per family: `_keys_to_ignore_on_load_unexpected`
# (NemotronH: `mtp.*`, modeling_nemotron_h.py; Llama and Mixtral have none) and the old
# checkpoints' `rotary_emb.inv_freq` buffers that modeling_utils.py's
# `_adjust_missing_and_unexpected_keys` adds for models holding one (Llama, Mixtral; NemotronH
# has no RoPE). Both as transformers matches them: `re.search` on the tensor name.
IGNORED_ON_LOAD = {"llama": (r"rotary_emb\.inv_freq",), "mixtral": (r"rotary_emb\.inv_freq",),
                   "nemotron_h": (r"mtp.*",)}


def unused_tensors(names: list[str], used: set[str], ignored: tuple[str, ...]) -> list[str]:
    """The stored names no rule uses, sorted; those matching a pattern transformers skips are
    left out, unless the mapping uses a tensor of that pattern (a NemotronH recipe with MTP
    depths imports `mtp.*`, which transformers skips only because it builds no MTP head)."""
    skipped = [p for p in ignored if not any(re.search(p, name) for name in used)]
    return sorted(name for name in names
                  if name not in used and not any(re.search(p, name) for p in skipped))


def unused_line(hf_dir: Path, architecture: str, unused: list[str]) -> str:
    """The line for stored tensors the mapping has no place for: how many, the first two."""
    shown = ", ".join(unused[:2]) + (", ..." if len(unused) > 2 else "")
    count = f"{len(unused)} tensor{'s' if len(unused) > 1 else ''}"
    return (f"hf={hf_dir} holds {count} that {architecture} of config.json's sizes has no place "
            f"for ({shown}); the weights do not match config.json: re-download the model")


def _in_file_order(plan: list[Rule], weights: hf_files.HFWeights) -> list[Rule]:
    shards = sorted(set(weights.weight_map.values()))
    return sorted(plan, key=lambda rule: shards.index(weights.shard_of(rule.hf[0])))


def check_source(hf_dir: Path, cfg: RunConfig) -> Source:
    """Every check that needs no weight data: config, shards, names and shapes (headers)."""
    config = hf_config.read_hf_config(hf_dir)
    family = hf_config.family(config)
    hf_config.compare_with_recipe(config, cfg.model, cfg.name)
    weights = hf_files.HFWeights(hf_dir)
    side = hf_files.side_files(hf_dir)  # a side file linking to nothing: refused before any work
    for path in side:
        if problem := hf_files.not_json(path):
            raise ConfigError(problem)
    shapes = shapes_of(cfg.model, cfg.layout.padded_vocab)
    plan = _in_file_order(rules(shapes), weights)
    unused = unused_tensors(list(weights.weight_map), {n for rule in plan for n in rule.hf},
                            IGNORED_ON_LOAD[family])
    if unused:
        raise ConfigError(unused_line(hf_dir, hf_config.architecture(config), unused))
    for rule in plan:
        for name, wanted in zip(rule.hf, hf_shapes(rule, shapes), strict=True):
            got = weights.shape(name)
            if got != wanted:
                raise ConfigError(f"hf tensor {name} has shape {list(got)} but recipe "
                                  f"{cfg.name} needs {list(wanted)}; the weights do not match "
                                  "their config.json")
            if problem := hf_files.not_floating(name, weights.dtype(name)):
                raise ConfigError(problem)
    return Source(config, weights, shapes, plan, side)


def _check_against_model(template: dict, source: Source) -> None:
    """The mapping must produce exactly the names and shapes the Megatron model holds."""
    ours = {rule.megatron: megatron_shape(rule, source.shapes) for rule in source.plan}
    model = megatron_side.weight_shapes(template)
    if ours != model:
        differ = sorted(set(ours.items()) ^ set(model.items()))[:4]
        raise RuntimeError(f"mapping and Megatron model disagree (first: {differ})")


def _convert(source: Source, progress) -> dict:
    tensors = {}
    task = progress.add_task("import", total=len(source.plan))
    for rule in source.plan:
        parts = [source.weights.get(name) for name in rule.hf]
        tensors[rule.megatron] = to_megatron(rule, parts, source.shapes)
        progress.advance(task)
    source.weights.close()
    return tensors


def _write_side_files(source: Source, hf_dir: Path, directory: Path) -> None:
    side = directory / HF_IMPORT_SOURCE
    side.mkdir()
    shutil.copy2(Path(hf_dir) / "config.json", side / "config.json")
    for path in source.side:  # those check_source read
        shutil.copy2(path, side / path.name)


def import_hf(hf_dir: Path, cfg: RunConfig, out: Path, progress) -> ImportResult:
    """Convert `hf_dir` for recipe `cfg` into the checkpoint directory `out` (module doc)."""
    started = time.perf_counter()
    hf_files.refuse_existing(out)
    source = check_source(hf_dir, cfg)
    if note := hf_files.no_tokenizer_note(hf_dir, source.side):
        progress.console.print(note, soft_wrap=True)  # the path whole, never cut
    shards = source.weights.shard_paths()
    checked = hf_digests.check_digests(shards, progress)
    if checked:
        progress.console.print(f"sha-256: {checked} of {len(shards)} shards match the digests "
                               "their download recorded")
    bytes_per = source.weights.element_bytes(source.plan[0].hf[0])
    progress.console.print(memory.estimate_line("import", memory.import_peak(source.shapes,
                                                                             bytes_per)))
    with megatron_side.one_process(cfg) as one:
        template = megatron_side.meta_template(one)
        _check_against_model(template, source)
        tensors = _convert(source, progress)
        tmp = hf_files.temporary_dir(out)
        try:
            megatron_side.save(template, tensors, one, tmp)
            save_config(cfg, tmp / "config.yaml")
            _write_side_files(source, hf_dir, tmp)
            import_manifest.write_manifest(tmp, cfg, one)  # last: every file's CRC-32
            hf_files.publish(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return ImportResult(out, len(tensors), size, time.perf_counter() - started)

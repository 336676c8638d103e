"""Samples and the micro-batches each data-parallel rank trains on, from every kind of source.

A `SampleSource` turns sample indices into one micro-batch. Sources:
- `TokenTable`: an in-memory byte-level corpus (the Python standard library, or synthetic
  text for golden numerics), cut into overlapping seq+1 windows; reshuffled each epoch.
- `MegatronSamples`: prepared datasets through Megatron Core's own `BlendedMegatronDatasetBuilder`
  and `GPTDataset` (blend weights, train/held-out split, its shuffling, and with
  `data.documents=inter_document` its per-document `cu_seqlens`), in the packed batch format
  (`plugins/protocol/packed_batch.py`) when documents are kept apart. A manifest's shards are one
  dataset there (`trainer/sharded_dataset.py`): the samples of the unsharded preparation.
- `PackedSamples`: exact packs of whole documents (`data_prep.packing`), one packed row each,
  the sources' rows in the blend's order (`trainer/pack_order.py`); under context parallelism
  packed for, and padded to, per-document multiples of 2 x CP, since Megatron cuts every
  document of a packed row into 2 x CP chunks.
`GlobalBatches` cuts every source alike: global batch k is samples [kG, (k+1)G) of the source's
order, each DP rank takes its contiguous share, in micro-batches. The data position that a
checkpoint saves is the number of samples taken, so it survives a change of batch or DP size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from data_prep.byte_tokenizer import ByteTokenizer
from data_prep.corpus import corpus_documents
from plugins.protocol.errors import ConfigError, RankUserError
from plugins.protocol.packed_batch import document_pad_multiple, packed_row
from recipes.config.blend import Blend, load_blend, manifest_split, preparation_seed
from recipes.config.phases import span_at
from recipes.config.schema import RunConfig
from trainer.pack_checks import CheckedIndexes, file_versions
from trainer.run_dir import DATA_INDEX

MicroBatch = dict[str, torch.Tensor]


def as_tensors(batch: dict) -> MicroBatch:
    """A micro-batch built as NumPy arrays (the packed format) as the tensors the model takes,
    sharing their memory; plain numbers (`max_seqlen`) stay numbers."""
    return {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for key, value in batch.items()}


class SampleSource(Protocol):
    reshuffle_each_epoch: bool  # whether GlobalBatches permutes the order every epoch
    source_names: tuple[str, ...]  # the blend's sources, in the order `source_ids` numbers them

    def __len__(self) -> int: ...

    def microbatch(self, indices: np.ndarray) -> MicroBatch: ...

    def source_ids(self, indices: np.ndarray) -> np.ndarray: ...


def source_labels(prefixes: Sequence[str]) -> tuple[str, ...]:
    """Short names of a blend's sources for logs: each prefix's file name, the whole prefix
    where two share a file name."""
    names = [Path(prefix).name for prefix in prefixes]
    return tuple(name if names.count(name) == 1 else prefix
                 for name, prefix in zip(names, prefixes, strict=True))


@dataclass(frozen=True)
class TokenTable:
    """Samples of `seq_length + 1` tokens from an in-memory stream: inputs [:-1], labels [1:]."""

    samples: np.ndarray
    eod: int
    eod_mask_loss: bool
    reshuffle_each_epoch: bool = True
    source_names: tuple[str, ...] = ("corpus",)

    def __len__(self) -> int:
        return len(self.samples)

    def source_ids(self, indices: np.ndarray) -> np.ndarray:
        return np.zeros(len(indices), dtype=np.int64)  # one stream, one source

    def microbatch(self, indices: np.ndarray) -> MicroBatch:
        rows = self.samples[indices]
        tokens = torch.from_numpy(rows[:, :-1].copy())
        labels = torch.from_numpy(rows[:, 1:].copy())
        loss_mask = torch.ones(tokens.shape, dtype=torch.float32)
        if self.eod_mask_loss:
            # Do not train the end-of-document token to predict the next document's first token.
            loss_mask[tokens == self.eod] = 0.0
        positions = torch.arange(tokens.shape[1], dtype=torch.long).expand_as(tokens).contiguous()
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
                "position_ids": positions}


def in_memory_sources(cfg: RunConfig) -> tuple[TokenTable, TokenTable]:
    """Train and held-out tables from the byte-level corpus (held-out = the stream's tail)."""
    tokenizer = ByteTokenizer()
    documents = corpus_documents(cfg.data.source, cfg.data.max_corpus_bytes, cfg.train.seed)
    stream = tokenizer.encode_documents(documents)
    seq = cfg.model.seq_length
    count = (len(stream) - 1) // seq  # consecutive samples overlap by one token
    if count < 2:
        raise ConfigError(
            f"the corpus gives only {len(stream)} tokens, too few for seq_length {seq}; raise "
            "data.max_corpus_bytes or lower model.seq_length"
        )
    samples = stream[(np.arange(count) * seq)[:, None] + np.arange(seq + 1)[None, :]]
    heldout = max(1, int(count * cfg.data.heldout_fraction))
    mask, names = cfg.data.eod_mask_loss, (cfg.data.source,)
    return (TokenTable(samples[:-heldout], tokenizer.eod, mask, source_names=names),
            TokenTable(samples[-heldout:], tokenizer.eod, mask, source_names=names))


class MegatronSamples:
    """A Megatron Core dataset (GPTDataset or BlendedDataset) as a sample source; with
    inter-document masking each sample becomes one packed row (micro-batch size 1)."""

    reshuffle_each_epoch = False  # Megatron's dataset index is already shuffled, per epoch

    def __init__(self, dataset, packed: bool, source_names: tuple[str, ...] = ("blend",)):
        self.dataset = dataset
        self.packed = packed
        self.source_names = source_names

    def __len__(self) -> int:
        return len(self.dataset)

    def source_ids(self, indices: np.ndarray) -> np.ndarray:
        """Which blend source each sample comes from: Megatron's BlendedDataset keeps it in
        `dataset_index` (`datasets/blended_dataset.py:107`); a lone GPTDataset is source 0."""
        index = getattr(self.dataset, "dataset_index", None)
        if index is None:
            return np.zeros(len(indices), dtype=np.int64)
        return np.asarray(index[indices], dtype=np.int64)

    def microbatch(self, indices: np.ndarray) -> MicroBatch:
        samples = [self.dataset[int(i)] for i in indices]
        batch = {key: torch.stack([s[key] for s in samples]) for key in
                 ("tokens", "labels", "loss_mask", "position_ids")}
        if self.packed:
            cu = samples[0]["cu_seqlens"].to(torch.int32)
            # Megatron pads cu_seqlens with its last value to a fixed length; keep the real ends.
            ends = torch.unique_consecutive(cu)
            batch["cu_seqlens"] = ends
            batch["max_seqlen"] = int((ends[1:] - ends[:-1]).max())
            batch["total_tokens"] = int(ends[-1])  # read here, on the host, not from a device
            # Every segment is a document: Megatron folds a short sample's padding into its
            # last one (`datasets/gpt_dataset.py:298-305`).
            batch["documents"] = len(ends) - 1
        return batch


class _TokenizerFacts:
    """What Megatron's GPTDataset asks of a tokenizer: the EOD id and the vocabulary size."""

    def __init__(self, blend: Blend) -> None:
        self.eod = blend.eod_id
        self.vocab_size = blend.vocab_size
        self.unique_identifiers = {"eod": blend.eod_id, "vocab_size": blend.vocab_size}


def megatron_sources(cfg: RunConfig, blend: Blend, cache: Path, eval_samples: int,
                     train_samples: int):
    """Train and held-out datasets built by Megatron Core's own blended dataset builder."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    from trainer.data_index_cache import check_data_index_cache
    from trainer.sharded_dataset import ShardedGPTDataset

    check_data_index_cache(cache)  # a damaged cache file: one line, not a pickle traceback
    if torch.distributed.is_initialized():  # rank 0 writes the cache only once all have read it
        torch.distributed.barrier()
    inter_document = cfg.data.documents == "inter_document"
    per_split = None if blend.valid is None else [
        blend.weights(blend.train), blend.weights(blend.valid), None]
    config = GPTDatasetConfig(
        random_seed=cfg.train.seed, sequence_length=cfg.model.seq_length,
        blend=blend.weights(blend.train) if blend.valid is None else None,
        blend_per_split=per_split,
        split=f"{blend.split[0]},{blend.split[1]},0" if blend.valid is None else None,
        path_to_cache=str(cache), tokenizer=_TokenizerFacts(blend),
        reset_position_ids=inter_document, reset_attention_mask=False,
        eod_mask_loss=cfg.data.eod_mask_loss, create_attention_mask=False,
        inter_document_masking=inter_document,
    )
    sizes = [train_samples, eval_samples, 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(ShardedGPTDataset, sizes, lambda: True,
                                                    config).build()
    names = source_labels([source.label for source in blend.train])
    heldout_names = names if blend.valid is None else source_labels(
        [source.label for source in blend.valid])
    return (MegatronSamples(train, inter_document, names),
            MegatronSamples(valid, inter_document, heldout_names))


@dataclass(frozen=True)
class SourcePacks:
    """One blend source's packs, numbered across its datasets (a manifest's shards, in order):
    `shards` holds each dataset with its pack index, `starts` the number of each one's first
    pack. A pack is found by bisection (not a list of every pack, 104 MB per million)."""

    shards: tuple[tuple[object, object], ...]  # (indexed dataset, pack index)
    starts: np.ndarray

    @classmethod
    def of(cls, shards: Sequence[tuple[object, object]]) -> SourcePacks:
        sizes = [len(index) for _, index in shards]
        return cls(tuple(shards), np.cumsum([0, *sizes[:-1]], dtype=np.int64))

    def __len__(self) -> int:
        return int(self.starts[-1]) + len(self.shards[-1][1])

    def locate(self, pack: int) -> tuple[object, object, int]:
        """(dataset, pack index, pack number in it) of this source's pack `pack`."""
        shard = int(np.searchsorted(self.starts, pack, side="right")) - 1
        dataset, index = self.shards[shard]
        return dataset, index, pack - int(self.starts[shard])


class PackedSamples:
    """Exact packs of whole documents: sample i is one packed row (micro-batch 1), pack
    `first[s] + packs[i]` of source s = `sources[i]` (`trainer/pack_order.py`; `first` is where
    a held-out share of each source's packs starts), each document padded to a multiple of
    `pad_multiple` (the packs were made for that multiple)."""

    reshuffle_each_epoch = False  # packs are shuffled once, seeded, when the index is built

    def __init__(self, tables: Sequence[SourcePacks], order: tuple[np.ndarray, np.ndarray],
                 seq_length: int, eod: int, pad_multiple: int = 1,
                 source_names: tuple[str, ...] = ("blend",), first: np.ndarray | None = None):
        self.tables = tuple(tables)
        self.sources, self.packs = order  # per row: source, pack of that source from `first`
        self.first = np.zeros(len(self.tables), np.int64) if first is None else first
        self.seq_length = seq_length
        self.eod = eod
        self.pad_multiple = pad_multiple
        self.source_names = source_names

    def cut(self, rows: slice) -> PackedSamples:
        """These rows only (views of the order, not copies)."""
        return PackedSamples(self.tables, (self.sources[rows], self.packs[rows]),
                             self.seq_length, self.eod, self.pad_multiple, self.source_names,
                             self.first)

    def __len__(self) -> int:
        return len(self.sources)

    def source_ids(self, indices: np.ndarray) -> np.ndarray:
        return np.asarray(self.sources[indices], dtype=np.int64)

    def microbatch(self, indices: np.ndarray) -> MicroBatch:
        row = int(indices[0])
        source = int(self.sources[row])
        dataset, index, number = self.tables[source].locate(
            int(self.packs[row]) + int(self.first[source]))
        documents, starts, lengths = index.pack(number)
        pieces = [dataset.get(int(d), offset=int(s), length=int(n))
                  for d, s, n in zip(documents, starts, lengths, strict=True)]
        return as_tensors(packed_row(pieces, self.seq_length, pad_id=self.eod,
                                     pad_multiple=self.pad_multiple))


def pack_seed(prefix: str, train_seed: int, manifest: str | None = None) -> int:
    """The seed of a pack index the trainer builds: the `seed=` of the preparation that made the
    dataset (its manifest records it: `manifest`, the blend's entry, else one beside it), so an
    index deleted and rebuilt, or one for another row length or pad multiple, packs as
    `scripts/prepare_data.py` would have; `train.seed` for a dataset no manifest lists."""
    seed = preparation_seed(prefix, manifest)
    return train_seed if seed is None else seed


def _pack_index(prefix: str, seq_length: int, seed: int, pad_multiple: int,
                manifest: str | None = None, checked: CheckedIndexes | None = None):
    """The pack index of one prepared dataset for this pad multiple, built beside it on first
    use (rank 0, seeded by `pack_seed`). Rank 0 checks every piece against the dataset's
    documents and tells the others what it found, so a damaged index is one `error:` line (a
    `ConfigError`, the same on every rank) before the first step, not an IndexError at the step
    that reads a garbled piece; the other ranks check the index's JSON, headers and sizes only
    (the pieces are read once per run, not once per rank), and so does rank 0 for an index
    whose files `checked` (rank 0's record, `trainer/pack_checks.py`) says it read whole at an
    earlier launch of the run."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from data_prep.packing import PackIndex, build_pack_index, pack_index_paths

    dataset, index, problem = IndexedDataset(prefix), None, [None]
    if torch.distributed.get_rank() == 0:
        try:
            if not pack_index_paths(prefix, seq_length, pad_multiple)[2].exists():
                build_pack_index(prefix, seq_length, seed=pack_seed(prefix, seed, manifest),
                                 pad_multiple=pad_multiple)
            try:
                versions = file_versions(prefix, seq_length, pad_multiple)
            except OSError:  # a file missing: PackIndex says which, in one line
                versions = None
            read = checked is None or versions is None or not checked.known(versions)
            index = PackIndex(prefix, seq_length, pad_multiple, check_pieces=read,
                              document_lengths=dataset.sequence_lengths if read else None)
            if read and checked is not None and versions is not None:
                checked.add(versions)
        except ConfigError as error:
            problem = [str(error)]
    torch.distributed.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise ConfigError(problem[0])
    if index is None:  # not rank 0: rank 0 read the pieces
        index = PackIndex(prefix, seq_length, pad_multiple, check_pieces=False)
    return dataset, index


def pack_order(cfg: RunConfig, cache: Path, counts: Sequence[int],
               weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The rows' order (`trainer/pack_order.py`, by `data.pack_order`), written to `cache` by
    rank 0 and mapped by every rank; a folder rank 0 cannot write is one line on every rank."""
    from trainer.pack_order import cached_order

    rule, problem = cfg.data.pack_order, [None]
    if torch.distributed.get_rank() == 0:
        try:
            cached_order(cache, rule, counts, weights, build=True)
        except OSError as error:
            problem = [f"cannot write the packed rows' order under {cache}: "
                       f"{error.strerror or error}; free space there or choose another run_dir"]
    torch.distributed.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise ConfigError(problem[0])
    return cached_order(cache, rule, counts, weights, build=False)


def split_packs(count: int, split: tuple[float, float]) -> int:
    """How many of a source's `count` packs train under a blend's `split` (the rest are held
    out): Megatron's bookend, round(count x train share) (`BlendedMegatronDatasetBuilder`
    splits each dataset so before blending it)."""
    return int(round(count * split[0] / sum(split)))


def packed_sources(cfg: RunConfig, blend: Blend,
                   cache: Path) -> tuple[PackedSamples, PackedSamples]:
    """The packs of every train source (a manifest's: each shard's, in order), interleaved by
    the blend's weights (`pack_order`, cached in `cache`); held-out packs from `valid`, else
    each source's last packs by the split (`split_packs`), interleaved the same way, so no
    pack is both trained on and held out however often the weights repeat a source's packs.
    `data.pack_order=v1` held out the last rows of the one order instead (its runs resume so)."""
    seq, seed = cfg.model.seq_length, cfg.train.seed
    multiple = document_pad_multiple(cfg.parallel.context)
    checked = CheckedIndexes(cache) if torch.distributed.get_rank() == 0 else None

    def tables_of(sources) -> list[SourcePacks]:
        tables = []
        for source in sources:
            named = manifest_split(source.prefix)
            manifest = named[0] if named else None  # a manifest entry: its seed at one look
            tables.append(SourcePacks.of([_pack_index(prefix, seq, seed, multiple,
                                                      manifest=manifest, checked=checked)
                                          for prefix in source.prefixes]))
        if checked is not None:
            checked.save()
        return tables

    def rows(tables, sources, counts, first=None) -> PackedSamples:
        order = pack_order(cfg, cache, counts, [source.weight for source in sources])
        names = source_labels([source.label for source in sources])
        return PackedSamples(tables, order, seq, blend.eod_id, multiple, names, first)

    tables = tables_of(blend.train)
    counts = [len(table) for table in tables]
    if blend.valid is not None:
        heldout_tables = tables_of(blend.valid)
        return (rows(tables, blend.train, counts),
                rows(heldout_tables, blend.valid, [len(table) for table in heldout_tables]))
    if cfg.data.pack_order == "v1":
        whole = rows(tables, blend.train, counts)
        count = max(1, round(len(whole) * blend.split[1] / sum(blend.split)))
        return (whole.cut(slice(None, -count)), whole.cut(slice(-count, None)))
    kept = [split_packs(count, blend.split) for count in counts]
    return (rows(tables, blend.train, kept),
            rows(tables, blend.train, [n - k for n, k in zip(counts, kept, strict=True)],
                 first=np.asarray(kept, dtype=np.int64)))


def build_sources(cfg: RunConfig, run_dir: Path,
                  train_samples: int | None = None) -> tuple[SampleSource, SampleSource]:
    """The train and held-out sources `cfg.data` names; Megatron's datasets are built for
    `train_samples` training samples (default: the whole run at `cfg`'s batch)."""
    if cfg.data.source != "blend":
        return in_memory_sources(cfg)
    # Read, not verified: the check before launch (the launching process's, or rank 0's for a
    # torchrun or Slurm launch, before the ranks meet) read every dataset's files already.
    blend = load_blend(str(cfg.data.blend), verify=False)
    if cfg.data.documents == "packed":
        return packed_sources(cfg, blend, run_dir / DATA_INDEX)
    eval_samples = max(1, cfg.train.eval_iters) * cfg.train.global_batch_size
    if train_samples is None:
        train_samples = cfg.train.train_iters * cfg.train.global_batch_size
    return megatron_sources(cfg, blend, run_dir / DATA_INDEX, eval_samples, train_samples)


def batch_outside_vocabulary(batch: MicroBatch, chunk: np.ndarray, source: SampleSource,
                       vocab_size: int) -> str | None:
    """A micro-batch's first token id outside [0, vocab_size), named with its sample and
    source; None when every id fits. The embedding lookup would fail on such an id (an
    IndexError on CPU, a device-side assert on a GPU) at whatever step first reads it, hours
    into a run; the checks before launch look at a bare prefix's first and last tokens only.
    Read on the host before the batch moves to its device, so no synchronisation."""
    for key in ("tokens", "labels"):
        ids = batch[key]
        if int(ids.min()) >= 0 and int(ids.max()) < vocab_size:
            continue
        outside = (ids < 0) | (ids >= vocab_size)
        row = int(outside.any(dim=-1).nonzero()[0, 0])
        value = int(ids[row][outside[row]][0])
        sample = int(chunk[min(row, len(chunk) - 1)])
        name = source.source_names[int(source.source_ids(np.asarray([sample]))[0])]
        fix = (f"prepare it again with this model's tokenizer, or raise model.vocab_size to "
               f"{value + 1} or more" if value >= 0 else
               "the files were not written as token ids; prepare them again")
        return (f"sample {sample:,} of source {name} holds token id {value:,}, outside the model's "
                f"vocabulary (model.vocab_size={vocab_size:,}): the data was tokenized for "
                f"another vocabulary; {fix}")
    return None


def heldout_batch_problem(cfg: RunConfig, heldout: int, samples: int) -> str | None:
    """The refusal of a held-out split of `heldout` samples (of `samples` in all) smaller
    than one global batch, with the fix; None when one batch fits."""
    batch = cfg.train.global_batch_size
    if heldout >= batch:
        return None
    fix = ("give the blend more held-out data (its split or valid sources)"
           if cfg.data.source == "blend" else
           f"raise data.heldout_fraction to at least {fraction_for(batch, samples):g}")
    return (f"the held-out split has {heldout} samples, fewer than one global batch "
            f"({batch}); {fix}, or lower train.global_batch_size")


def fraction_for(wanted: int, samples: int) -> float:
    """The smallest `data.heldout_fraction` of two significant digits that keeps `wanted` of
    `samples` held out (`in_memory_sources` rounds the share down)."""
    digits = 1 - math.floor(math.log10(wanted / samples))  # decimals of two significant
    fraction = round(math.ceil(wanted / samples * 10**digits) / 10**digits, digits)
    while int(samples * fraction) < wanted:  # a float product just short of `wanted`
        fraction = round(fraction + 10**-digits, digits)
    return fraction


def eval_batches_note(cfg: RunConfig, heldout: int, samples: int) -> str | None:
    """The note of an evaluation cut to the whole global batches the held-out split has,
    fewer than `train.eval_iters`; None when they all fit."""
    t = cfg.train
    batches = heldout // t.global_batch_size
    if batches >= t.eval_iters:
        return None
    fix = ("give the blend more held-out data" if cfg.data.source == "blend" else
           "raise data.heldout_fraction to at least "
           f"{fraction_for(t.eval_iters * t.global_batch_size, samples):g}")
    return (f"note: held-out evaluation uses {batches} of train.eval_iters={t.eval_iters} "
            f"global batches: the held-out split has {heldout} samples, {t.global_batch_size} a "
            f"batch; {fix} for all {t.eval_iters}")


class GlobalBatches:
    """Yields, for each step, this DP rank's micro-batches of that step's global batch.

    The data position is counted in samples, as Megatron-LM's consumed samples are: a resume
    with another global batch size or another DP size continues at the same sample. Every
    micro-batch's ids are checked against the model's vocabulary (`batch_outside_vocabulary`).
    """

    def __init__(self, source: SampleSource, cfg: RunConfig, dp_rank: int):
        self.source = source
        self.seed = cfg.train.seed
        self.dp_rank = dp_rank
        self.micro_batch = cfg.train.micro_batch_size
        self.data_parallel = cfg.layout.data_parallel
        self.global_batch = cfg.train.global_batch_size
        self.per_replica = cfg.layout.samples_per_replica  # samples of a batch per DP rank
        self.vocab_size = cfg.model.vocab_size
        self.next_sample = 0  # the data position: samples taken by `take` (tails included)
        self.last_taken = np.zeros(0, dtype=np.int64)  # sample indices of the last `take`
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its order), reused per step
        if len(source) < self.global_batch:
            raise ConfigError(
                f"the data has {len(source)} samples, fewer than one global batch "
                f"({self.global_batch}); lower train.global_batch_size or add data"
            )

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's sample order, drawn once per epoch (not once per step)."""
        if self._order is None or self._order[0] != epoch:
            order = np.random.default_rng((self.seed, epoch)).permutation(len(self.source))
            self._order = (epoch, order)
        return self._order[1]

    def _batch_at(self, position: int) -> tuple[np.ndarray, int]:
        """Sample indices of the global batch starting at sample `position`, and the position
        after it. An epoch is the whole global batches that fit; a batch that would run past
        them (the dropped tail, or after a change of batch size) starts the next epoch."""
        per_epoch = len(self.source) // self.global_batch * self.global_batch
        epoch, within = divmod(position, per_epoch)
        if within + self.global_batch > per_epoch:
            epoch, within = epoch + 1, 0
        end = epoch * per_epoch + within + self.global_batch
        if not self.source.reshuffle_each_epoch:  # the source is already in training order
            return np.arange(within, within + self.global_batch), end
        return self._epoch_order(epoch)[within : within + self.global_batch], end

    def global_batch_indices(self, step: int) -> np.ndarray:
        """Sample indices of global batch `step` of a run (a partial tail of an epoch is
        dropped)."""
        return self._batch_at(step * self.global_batch)[0]

    def _my_microbatch_indices(self, indices: np.ndarray) -> list[np.ndarray]:
        mine = indices[self.dp_rank * self.per_replica : (self.dp_rank + 1) * self.per_replica]
        return [mine[i : i + self.micro_batch]
                for i in range(0, self.per_replica, self.micro_batch)]

    def _mine(self, indices: np.ndarray) -> list[MicroBatch]:
        batches = []
        for chunk in self._my_microbatch_indices(indices):
            batches.append(batch := self.source.microbatch(chunk))
            if problem := batch_outside_vocabulary(batch, chunk, self.source, self.vocab_size):
                raise RankUserError(problem)  # this rank's samples only: it says so itself
        return batches

    def microbatch_indices(self, step: int) -> list[np.ndarray]:
        """Sample indices of this rank's micro-batches of global batch `step` (benchmarks read
        them with the source alone)."""
        return self._my_microbatch_indices(self.global_batch_indices(step))

    def microbatches(self, step: int) -> list[MicroBatch]:
        """This rank's micro-batches of global batch `step` (held-out batches, benchmarks)."""
        return self._mine(self.global_batch_indices(step))

    def upcoming(self) -> list[MicroBatch]:
        """This rank's micro-batches of the batch `take` returns next (without taking it)."""
        return self._mine(self._batch_at(self.next_sample)[0])

    def take(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next global batch; advances the data position."""
        indices, self.next_sample = self._batch_at(self.next_sample)
        self.last_taken = indices
        return self._mine(indices)

    def resize(self, global_batch: int) -> None:
        """Take global batches of another size from here on (a phase's batch): the position
        in samples stays, as after a resume with another batch size."""
        self.global_batch = global_batch
        self.per_replica = global_batch // self.data_parallel

    def state_dict(self) -> dict[str, int]:
        return {"next_sample": self.next_sample}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if "next_batch" in state:  # checkpoints before positions were counted in samples
            self.next_sample = int(state["next_batch"]) * self.global_batch
            return
        self.next_sample = int(state["next_sample"])


class PhasedBatches:
    """The training batches of a run in phases (recipes/config/phases.py): each phase takes
    global batches of its own size from its blend's stream. Phases that name the same blend
    share one stream, so a later phase continues where the earlier one stopped rather than
    seeing the same samples again. Every step counts the tokens it took per blend source
    (samples x sequence length, as every rank knows them without a collective).

    The saved state is each stream's position in samples and the per-source token counts, so
    a resume just before, at or after a boundary continues every stream exactly.
    """

    def __init__(self, spans, streams: dict[str, GlobalBatches], ramp=None):
        self.spans = spans
        self.streams = streams  # (blend or in-memory source, sequence length) -> its batches
        # With a batch ramp-up: Megatron Core's calculator, whose batch follows the consumed
        # samples (recipes/config/rampup.py); None: each phase's own batch.
        self.ramp = ramp
        self.source_tokens: dict[str, int] = {}  # tokens taken per source, over the whole run
        self.step = 0  # steps taken (the run state's step; set on resume)
        self.consumed = 0  # samples taken (the run state's consumed samples; set on resume)

    def current_batch(self) -> int:
        """The global batch of the next step: the ramp's at the samples consumed so far, else
        its phase's."""
        if self.ramp is None:
            return span_at(self.spans, self.step).global_batch_size
        self.ramp.update(self.consumed, consistency_check=True)
        return self.ramp.get_current_global_batch_size()

    @staticmethod
    def stream_key(span) -> str:
        """One stream per blend, sequence length (a longer sequence cuts other samples) and way
        of cutting rows (packed rows of whole documents are other samples again)."""
        rows = "" if span.documents == "concatenate" else f":{span.documents}"
        return f"{span.blend or 'corpus'}:{span.seq_length}{rows}"

    def stream_at(self, step: int) -> GlobalBatches:
        """The stream of the phase that trains step `step` (0-based), at that phase's batch."""
        span = span_at(self.spans, step)
        stream = self.streams[self.stream_key(span)]
        stream.resize(self.current_batch())
        return stream

    def phase_at(self, step: int):
        return span_at(self.spans, step)

    def take(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next step's global batch; counts its tokens."""
        seq_length = span_at(self.spans, self.step).seq_length
        stream = self.stream_at(self.step)
        microbatches = stream.take()
        self.step += 1
        self.consumed += stream.global_batch
        ids = stream.source.source_ids(stream.last_taken)
        for number, count in zip(*np.unique(ids, return_counts=True), strict=True):
            name = stream.source.source_names[int(number)]
            self.source_tokens[name] = self.source_tokens.get(name, 0) + int(count) * seq_length
        return microbatches

    def upcoming(self) -> list[MicroBatch]:
        """This rank's micro-batches of the batch `take` returns next (without taking it)."""
        return self.stream_at(self.step).upcoming()

    def microbatches(self, step: int) -> list[MicroBatch]:
        """Global batch `step` of the first phase's stream (benchmarks)."""
        return self.stream_at(0).microbatches(step)

    def state_dict(self) -> dict:
        return {"streams": {key: stream.state_dict() for key, stream in self.streams.items()},
                "source_tokens": dict(self.source_tokens)}

    def load_state_dict(self, state: dict) -> None:
        """Each stream's position; a checkpoint of a run without phases holds the one
        stream's position alone."""
        streams = state.get("streams")
        if streams is None:
            next(iter(self.streams.values())).load_state_dict(state)
            return
        for key, position in streams.items():
            if key in self.streams:
                self.streams[key].load_state_dict(position)
        self.source_tokens = {name: int(n) for name, n in state.get("source_tokens", {}).items()}

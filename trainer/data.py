"""Token samples and the micro-batches each data-parallel rank trains on.

Every rank builds the same sample table from the corpus (cheap at this size) and takes its own
slice of each global batch, so any DP/TP/PP layout sees exactly the same global batches.
Later data sources (Megatron indexed datasets, packed sequences) replace `load_samples`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from data_prep.corpus import corpus_documents
from data_prep.tokenizer import ByteTokenizer
from recipes.config.errors import ConfigError
from recipes.config.schema import RunConfig

MicroBatch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SampleTable:
    """Samples of `seq_length + 1` tokens: inputs are [:-1], labels are [1:]."""

    train: np.ndarray
    heldout: np.ndarray
    eod: int


def load_samples(cfg: RunConfig) -> SampleTable:
    tokenizer = ByteTokenizer()
    documents = corpus_documents(cfg.data.source, cfg.data.max_corpus_bytes, cfg.train.seed)
    stream = tokenizer.encode_documents(documents)
    width = cfg.model.seq_length + 1
    # Consecutive samples overlap by one token so every token is a label exactly once.
    count = (len(stream) - 1) // cfg.model.seq_length
    if count < 2:
        raise ConfigError(
            f"the corpus gives only {len(stream)} tokens, too few for seq_length "
            f"{cfg.model.seq_length}; raise data.max_corpus_bytes or lower model.seq_length"
        )
    starts = np.arange(count) * cfg.model.seq_length
    samples = stream[starts[:, None] + np.arange(width)[None, :]]
    heldout_count = max(1, int(count * cfg.data.heldout_fraction))
    return SampleTable(samples[:-heldout_count], samples[-heldout_count:], tokenizer.eod)


def _to_microbatch(rows: np.ndarray, eod: int, eod_mask_loss: bool) -> MicroBatch:
    tokens = torch.from_numpy(rows[:, :-1].copy())
    labels = torch.from_numpy(rows[:, 1:].copy())
    loss_mask = torch.ones(tokens.shape, dtype=torch.float32)
    if eod_mask_loss:
        # Do not train the end-of-document token to predict the next document's first token.
        loss_mask[tokens == eod] = 0.0
    positions = torch.arange(tokens.shape[1], dtype=torch.long).expand_as(tokens).contiguous()
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": positions}


class GlobalBatches:
    """Yields, for each step, this DP rank's micro-batches of that step's global batch."""

    def __init__(self, samples: np.ndarray, cfg: RunConfig, dp_rank: int, eod: int):
        self.samples = samples
        self.cfg = cfg
        self.dp_rank = dp_rank
        self.eod = eod
        self.global_batch = cfg.train.global_batch_size
        self.per_replica = cfg.layout.samples_per_replica  # samples of a batch per DP rank
        self.next_batch = 0  # the data position: global batches taken by `take`
        if len(samples) < self.global_batch:
            raise ConfigError(
                f"the corpus has {len(samples)} training samples, fewer than one global batch "
                f"({self.global_batch}); lower train.global_batch_size or raise "
                "data.max_corpus_bytes"
            )

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.cfg.train.seed, epoch)).permutation(len(self.samples))

    def global_batch_indices(self, step: int) -> np.ndarray:
        """Sample indices of global batch `step` (epochs reshuffle; a partial tail is dropped)."""
        per_epoch = len(self.samples) // self.global_batch
        epoch, within = divmod(step, per_epoch)
        order = self._epoch_order(epoch)
        return order[within * self.global_batch : (within + 1) * self.global_batch]

    def microbatches(self, step: int) -> list[MicroBatch]:
        indices = self.global_batch_indices(step)
        per_rank = self.per_replica
        mine = indices[self.dp_rank * per_rank : (self.dp_rank + 1) * per_rank]
        mbs = self.cfg.train.micro_batch_size
        eod_mask = self.cfg.data.eod_mask_loss
        return [
            _to_microbatch(self.samples[mine[i : i + mbs]], self.eod, eod_mask)
            for i in range(0, per_rank, mbs)
        ]

    def take(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next global batch; advances the data position."""
        microbatches = self.microbatches(self.next_batch)
        self.next_batch += 1
        return microbatches

    def state_dict(self) -> dict[str, int]:
        return {"next_batch": self.next_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_batch = int(state["next_batch"])

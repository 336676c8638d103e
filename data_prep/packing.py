"""Exact sequence packing: documents into rows of `pack_size` tokens, and an on-disk pack index.

Why: a packed row holds whole documents (or contiguous pieces of them) side by side, so each
token can attend only within its own document while rows stay almost free of padding. The
packer is exact best-fit-decreasing over the *global* histogram of document lengths: every
document of the corpus is seen at once (packing small batches separately wastes rows), and all
documents of one length are placed in one bulk step, so the work grows with the number of
distinct lengths, not with the number of documents.

How best fit is done in bulk: open packs are grouped by their remaining space. Lengths are
visited from the longest down. A piece of length L goes to the pack with the least remaining
space r >= L; that pack then has r - L left, which is again the best fit while it is >= L, so
each pack in group r takes r // L pieces in a row and every pack of a group behaves alike. The
groups r = L, L + 1, ... are therefore consumed whole, in order, until the pieces of length L
run out; what is left opens new packs of pack_size // L pieces each.

Conventions:
- Documents longer than the pack follow `long_documents`: "split" (pretraining) cuts them into
  pack-sized pieces plus one shorter last piece, which is packed like any document; "truncate"
  (fine-tuning) keeps the first `pack_size` tokens and drops the rest.
- A piece is one contiguous span `[start, start + length)` of one document; document tokens are
  never reordered. Pieces of a split document are placed independently: they need not be in
  consecutive packs or in start order across packs.
- Within a pack, pieces are in the order best fit placed them: longest first, equal lengths in
  ascending document id (a pack never holds two pieces of one document). The packs themselves
  are shuffled after packing, seeded, so the pack order (and hence the training order) is a
  deterministic function of the lengths, pack size, policy and seed, and resuming a run never
  reshuffles it.
- Zero-length documents are skipped and counted (`empty_documents`); they are in no pack.
- With `pad_multiple` m > 1 (context parallel: m = 2 x CP, since Megatron cuts every document of
  a packed row into 2 x CP chunks) every piece occupies its length rounded up to a multiple of m
  in its pack, the padding after its own tokens (the packed row format,
  `plugins/protocol/packed_batch.py`: `padded_length`, `packed_row(..., pad_multiple=m)`).
  The pack size must then be a multiple of m, so split pieces of the pack size need no padding.
  Best fit runs on these padded lengths, in slots of m positions (the same placements as on
  padded lengths in tokens, with a histogram m times shorter); the pieces stored keep their real
  lengths, and the statistics count real tokens, so `efficiency` shows what the padding costs.
  With m = 1 nothing changes: same packs, same files, same bytes.

The pack index (`write_pack_index` / `PackIndex`) stores a packing beside an indexed dataset
with prefix P (`P.bin`, `P.idx`) as three files, published by rename only once complete:
`P.pack<pack_size>.pieces.npy` (int64, one row per piece: document id, start, length, in pack
order), `P.pack<pack_size>.offsets.npy` (int64, packs + 1 entries: pack i is rows
offsets[i]:offsets[i + 1]) and `P.pack<pack_size>.json` (pack size, policy, seed, statistics).
A packing for a pad multiple m > 1 is a different packing, so its files are named
`P.pack<pack_size>.pad<m>.*` and its JSON records `pad_multiple`; an m = 1 index keeps the plain
name and has no such key, so indexes written before pad multiples existed stay valid. A damaged
index is found when a rank opens it (the checks before launch read no pack index: which one a
run reads depends on its sequence length and context parallelism) and is a one-line
`ConfigError` naming the file and the user's fix (`REPAIR`): the same prepare_data command
rewrites every index. Opening one checks all it holds, since a garbled body behind an intact
numpy header maps without complaint and would fail only at the step that reads it (a document
id beyond the dataset, a pack longer than a row): the three files are regular files of the sizes
their headers and the JSON say; the offsets start at 0, rise by at least one piece a pack and end
at the piece count; every piece is a non-empty span inside its document (given the dataset's
document lengths) and every pack, padded pieces included, fits the pack size; the token and
piece counts agree with the JSON's statistics. That is one pass over the pieces, in chunks, on
opening (about 24 bytes a piece), nothing per step; the trainer makes it on rank 0 alone and
tells the other ranks what it found (`trainer/data.py`), so a run reads the pieces once.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, insort
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from data_prep.npy_file import npy_problem
from plugins.protocol.errors import ConfigError
from plugins.protocol.packed_batch import padded_length

LONG_DOCUMENT_POLICIES = ("split", "truncate")
INDEX_FORMAT = "mcore-recipes pack index 1"
MAX_PACK_SIZE = 1 << 24  # the histogram and the open-pack table grow with the pack size


@dataclass(frozen=True)
class PackingStats:
    """What a packing achieved. Token counts are after truncation."""

    documents: int  # input documents, empty ones included
    empty_documents: int  # zero-length documents: skipped, in no pack
    tokens: int  # tokens placed in packs
    pieces: int  # contiguous spans placed; a split document gives several
    packs: int
    lower_bound: int  # ceil(tokens / pack_size): no packing can use fewer packs
    efficiency: float  # tokens / (packs * pack_size): share of row slots holding tokens
    packing_factor: float  # pieces / packs: attention segments per row (a piece counts as one)
    max_pieces_per_pack: int
    split_documents: int  # documents cut into several pieces ("split")
    truncated_documents: int  # documents cut to pack_size tokens ("truncate")
    dropped_tokens: int  # tokens removed by truncation

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Packing:
    """Pieces in pack order; pack i is pieces pack_offsets[i]:pack_offsets[i + 1]."""

    pack_size: int
    long_documents: str
    seed: int
    doc_ids: np.ndarray  # int64, per piece: which document
    starts: np.ndarray  # int64, per piece: first token's offset within the document
    lengths: np.ndarray  # int64, per piece: tokens
    pack_offsets: np.ndarray  # int64, packs + 1 entries
    stats: PackingStats
    pad_multiple: int = 1  # each piece occupies its length rounded up to a multiple of this

    def __len__(self) -> int:
        return len(self.pack_offsets) - 1

    def pack(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document ids, starts, lengths) of pack `i`'s pieces."""
        lo, hi = _pack_bounds(self.pack_offsets, i, "packing")
        return self.doc_ids[lo:hi], self.starts[lo:hi], self.lengths[lo:hi]


def pack_documents(
    lengths, pack_size: int, *, long_documents: str = "split", seed: int = 0,
    pad_multiple: int = 1,
) -> Packing:
    """Pack documents of the given token `lengths` (document id = index) into packs; with
    `pad_multiple` m, each piece takes its length rounded up to a multiple of m."""
    lengths = _checked_lengths(lengths)
    _check_settings(pack_size, long_documents, seed, pad_multiple)
    pack_size, multiple = int(pack_size), int(pad_multiple)
    pieces, counts = _cut_pieces(lengths, pack_size, long_documents)
    tails = int(np.count_nonzero(pieces.size))
    if tails + len(pieces.full_doc) == 0:
        raise ValueError(f"all {len(lengths)} documents have length 0; there is nothing to pack")
    # Best fit in slots of `multiple` positions: a piece of n tokens takes its padded length
    # (the packed row format's rule) in slots of `multiple`.
    slots, room = padded_length(pieces.size, multiple) // multiple, pack_size // multiple
    # Last pieces longest (padded) first, equal ones in document order; the empty ones sort last.
    by_length = _stable_argsort(room - slots, room)[:tails]
    placements = _best_fit_decreasing(slots, room, len(pieces.full_doc))
    order, offsets = _in_shuffled_pack_order(placements, seed)
    doc, start, size = _documents_and_starts(pieces, lengths, by_length, order, pack_size)
    tokens = int(size.sum())
    packs = len(offsets) - 1
    stats = PackingStats(
        documents=len(lengths),
        empty_documents=len(lengths) - int(np.count_nonzero(lengths)),
        tokens=tokens,
        pieces=len(size),
        packs=packs,
        lower_bound=-(-tokens // pack_size),
        efficiency=tokens / (packs * pack_size),
        packing_factor=len(size) / packs,
        max_pieces_per_pack=int(np.diff(offsets).max()),
        **counts,
    )
    arrays = [_frozen(a) for a in (doc, start, size, offsets)]
    return Packing(pack_size, long_documents, int(seed), *arrays, stats, multiple)


def next_fit_pack_count(lengths, pack_size: int) -> int:
    """Packs used by naive next-fit in document order (documents longer than the pack split):
    the baseline that benchmarks and tests compare best fit against."""
    lengths = _checked_lengths(lengths)
    _check_settings(pack_size, "split", 0)
    packs, space = 0, 0
    for length in lengths.tolist():
        full, rest = divmod(length, pack_size)
        packs += full
        if rest > space:
            packs += 1
            space = pack_size
        space -= rest
    return packs


def _checked_lengths(lengths) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(
            f"document lengths must be one-dimensional, got shape {array.shape}; pass one "
            "length per document"
        )
    if len(array) == 0:
        raise ValueError("document lengths are empty; pass at least one document length")
    if array.dtype.kind not in "iu":
        raise ValueError(
            f"document lengths must be integers, got dtype {array.dtype}; convert them with "
            ".astype(np.int64)"
        )
    array = array.astype(np.int64, copy=False)
    low = int(array.argmin())
    if array[low] < 0:
        raise ValueError(
            f"document {low} has length {int(array[low])}; lengths count tokens and must be >= 0"
        )
    return array


def _check_settings(pack_size, long_documents, seed, pad_multiple=1) -> None:
    if not _is_int(pack_size) or pack_size <= 0:
        raise ValueError(f"pack_size {pack_size!r} must be a positive integer (tokens per pack)")
    if pack_size > MAX_PACK_SIZE:
        raise ValueError(
            f"pack_size {pack_size} is above {MAX_PACK_SIZE:,}, the largest this packer's "
            "length histogram supports; use a smaller pack"
        )
    if long_documents not in LONG_DOCUMENT_POLICIES:
        raise ValueError(
            f"long_documents {long_documents!r} is not a policy; use 'split' (pretraining) or "
            "'truncate' (fine-tuning)"
        )
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed {seed!r} must be a non-negative integer")
    if not _is_int(pad_multiple) or pad_multiple <= 0:
        raise ValueError(
            f"pad_multiple {pad_multiple!r} must be a positive integer (1: no padding; context "
            "parallel: 2 x CP)"
        )
    if pack_size % pad_multiple:
        fits = pack_size - pack_size % pad_multiple or pad_multiple
        raise ValueError(
            f"pack_size {pack_size} is not a multiple of pad_multiple {pad_multiple}; use a "
            f"pack size divisible by it, e.g. {fits}"
        )


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Pieces:
    """Pieces to pack: every document's last (or only) piece, `size[d]` tokens long (0: none),
    and the pack-sized pieces that splitting cuts from the documents marked `long` (None when
    there are none)."""

    size: np.ndarray
    long: np.ndarray | None
    full_doc: np.ndarray
    full_start: np.ndarray


def _cut_pieces(lengths: np.ndarray, pack_size: int, policy: str) -> tuple[_Pieces, dict]:
    long = lengths > pack_size
    any_long = bool(long.any())
    counts = {"split_documents": 0, "truncated_documents": 0, "dropped_tokens": 0}
    size = lengths.copy() if any_long else lengths
    full_doc = full_start = np.zeros(0, np.int64)
    if any_long and policy == "truncate":
        counts["truncated_documents"] = int(np.count_nonzero(long))
        counts["dropped_tokens"] = int((lengths[long] - pack_size).sum())
        size[long] = pack_size
    elif any_long:
        counts["split_documents"] = int(np.count_nonzero(long))
        size[long] %= pack_size
        long_ids = np.flatnonzero(long)
        full = lengths[long_ids] // pack_size
        full_doc = np.repeat(long_ids, full)
        first = np.repeat(np.cumsum(full) - full, full)
        full_start = (np.arange(len(full_doc)) - first) * pack_size
    split_long = long if any_long and policy == "split" else None
    return _Pieces(size, split_long, full_doc, full_start), counts


def _documents_and_starts(pieces: _Pieces, lengths, by_length, order, pack_size: int):
    """Document, start offset and (real) length of every piece in pack order. `order` indexes
    the pieces sorted longest first: the last pieces (`by_length`: their documents), then the
    pack-sized ones."""
    tails = len(by_length)
    source = np.concatenate([by_length, pieces.full_doc]) if len(pieces.full_doc) else by_length
    doc = source[order]
    size = np.where(order < tails, pieces.size[doc], pack_size)
    start = np.zeros(len(doc), np.int64)
    if pieces.long is not None:
        of_long = np.flatnonzero(pieces.long[doc])
        full = order[of_long] >= tails
        start[of_long[full]] = pieces.full_start[order[of_long[full]] - tails]
        last = of_long[~full]
        start[last] = lengths[doc[last]] - size[last]
    return doc, start, size


@dataclass(frozen=True)
class _Placements:
    """Best fit's placements in order: placement p puts `each[p]` pieces into pack `pack[p]`;
    together they take the pieces sorted longest first, in turn."""

    pack: np.ndarray
    each: np.ndarray
    packs: int


def _best_fit_decreasing(size: np.ndarray, pack_size: int, full_pieces: int) -> _Placements:
    """Best fit of the last pieces (`size`, in units of the pack's `pack_size`), then one pack
    for each pack-sized piece."""
    histogram = np.bincount(size, minlength=pack_size + 1)
    histogram[0] = 0
    present = np.flatnonzero(histogram)[::-1]  # longest first
    alone = present[2 * present > pack_size]
    open_packs = _OpenPacks(pack_size, alone, histogram[alone])
    counts = histogram.tolist()
    for length in present[len(alone) :].tolist():
        open_packs.place(length, counts[length])
    later = np.array(open_packs.moves, np.int64).reshape(-1)
    moves = np.concatenate([open_packs.first_moves, later])
    moves = moves.reshape(-1, 5).T
    pack = _pack_ids(moves[0], moves[1], moves[2], pack_size)
    packs = int(pack.max()) + 1 if len(pack) else 0
    each = np.repeat(moves[3], moves[2])
    return _Placements(
        np.concatenate([pack, packs + np.arange(full_pieces)]),
        np.concatenate([each, np.ones(full_pieces, np.int64)]),
        packs + full_pieces,
    )


class _OpenPacks:
    """How many open packs have each remaining space (`packs_at`), and the moves that best fit
    makes (`first_moves` flat, then `moves`): (from space, to space, packs, pieces each,
    length); from space 0 opens new packs, to space 0 fills them."""

    def __init__(self, pack_size: int, alone: np.ndarray, counts: np.ndarray):
        """Start with the pieces longer than half a pack (`alone`, longest first): none fits
        beside another, so each opens a pack of its own, in one bulk step."""
        self.pack_size = pack_size
        left = pack_size - alone
        first = np.stack([np.zeros_like(alone), left, counts, np.ones_like(alone), alone], 1)
        self.first_moves = first.reshape(-1)
        self.packs_at = dict(zip(left[left > 0].tolist(), counts[left > 0].tolist(), strict=True))
        self.spaces = sorted(self.packs_at)  # remaining spaces that hold at least one open pack
        self.moves: list[tuple[int, int, int, int, int]] = []

    def place(self, length: int, n: int) -> None:
        """Best fit for `n` pieces of `length`: least remaining space first, then new packs."""
        spaces, packs_at = self.spaces, self.packs_at
        i = bisect_left(spaces, length)
        while n and i < len(spaces):
            space = spaces[i]
            packs = packs_at[space]
            each = space // length
            if n < each * packs:
                self._place_some(space, packs, each, length, n)
                return
            del spaces[i], packs_at[space]
            n -= each * packs
            self._move(space, packs, each, length)
            i = bisect_left(spaces, length)
        if n:
            each = self.pack_size // length
            full, rest = divmod(n, each)
            self._move(0, full, each, length)
            self._move(0, int(rest > 0), rest, length)

    def _place_some(self, space: int, packs: int, each: int, length: int, n: int) -> None:
        """The last space reached takes the remaining n pieces: whole packs, then one pack
        takes the rest."""
        full, rest = divmod(n, each)
        left = packs - full - (rest > 0)
        if left:
            self.packs_at[space] = left
        else:
            del self.packs_at[space]
            self.spaces.remove(space)
        self._move(space, full, each, length)
        self._move(space, int(rest > 0), rest, length)

    def _move(self, space: int, packs: int, each: int, length: int) -> None:
        if not packs:
            return
        left = (space or self.pack_size) - each * length
        self.moves.append((space, left, packs, each, length))
        if left:
            if left in self.packs_at:
                self.packs_at[left] += packs
            else:
                self.packs_at[left] = packs
                insort(self.spaces, left)


def _pack_ids(source, target, packs, pack_size: int) -> np.ndarray:
    """Pack id (in opening order) of every placement, one per pack per move. Packs with equal
    remaining space are interchangeable, so a move away from a space takes the packs that
    arrived there first; each placement is followed back to the one that opened its pack."""
    source, target = np.repeat(source, packs), np.repeat(target, packs)
    arrived = _stable_argsort(target, pack_size)  # placements by space reached, in order
    leaving = np.flatnonzero(source)  # placements into packs opened before
    leaving = leaving[_stable_argsort(source[leaving], pack_size)]
    space = source[leaving]
    nth = np.arange(len(leaving)) - _group_starts(space, pack_size)[space]
    previous = np.arange(len(source))
    previous[leaving] = arrived[_group_starts(target, pack_size)[space] + nth]
    while True:  # pointer doubling: each placement to the first placement of its pack
        earlier = previous[previous]
        if np.array_equal(earlier, previous):
            break
        previous = earlier
    return (np.cumsum(source == 0) - 1)[previous]


def _group_starts(keys: np.ndarray, max_key: int) -> np.ndarray:
    """Where each key's group starts once `keys` are sorted."""
    counts = np.bincount(keys, minlength=max_key + 1)
    return np.cumsum(counts) - counts


def _stable_argsort(keys: np.ndarray, max_key: int) -> np.ndarray:
    """Stable argsort of non-negative keys through numpy's 16-bit radix sort (one pass per
    16 bits), several times faster than the comparison sort used for wider integers."""
    if max_key >= 1 << 32:
        return np.argsort(keys, kind="stable")
    order = np.argsort(keys.astype(np.uint16), kind="stable")  # the low 16 bits
    if max_key < 1 << 16:
        return order
    high = (keys[order] >> 16).astype(np.uint16)
    return order[np.argsort(high, kind="stable")]


def _in_shuffled_pack_order(placements: _Placements, seed: int):
    """Packs in a seeded random order, each pack's pieces in placement order: the sorted-piece
    position of every piece in that order and the packs' offsets."""
    packs = placements.packs
    rank = np.empty(packs, np.int64)
    rank[np.random.default_rng(seed).permutation(packs)] = np.arange(packs)
    first = np.cumsum(placements.each) - placements.each  # sorted position of the first piece
    pack_rank = rank[placements.pack]
    by_pack = _stable_argsort(pack_rank, packs - 1)
    each = placements.each[by_pack]
    out_first = np.cumsum(each) - each
    order = np.repeat(first[by_pack] - out_first, each)
    order += np.arange(len(order))
    per_pack = np.bincount(pack_rank, weights=placements.each, minlength=packs)
    offsets = np.zeros(packs + 1, np.int64)
    np.cumsum(per_pack.astype(np.int64), out=offsets[1:])
    return order, offsets


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.int64)
    array.flags.writeable = False
    return array


def _pack_bounds(offsets: np.ndarray, i: int, what: str) -> tuple[int, int]:
    packs = len(offsets) - 1
    if not _is_int(i) or not 0 <= i < packs:
        raise IndexError(f"pack {i!r} is out of range for the {what}; it has packs 0..{packs - 1}")
    return int(offsets[i]), int(offsets[i + 1])


def pack_index_paths(
    prefix: str | os.PathLike, pack_size: int, pad_multiple: int = 1
) -> tuple[Path, Path, Path]:
    """(pieces, offsets, json) file paths of the pack index beside the dataset `prefix`; the
    name carries the pad multiple when it is above 1."""
    stem = f"{os.fspath(prefix)}.pack{int(pack_size)}"
    if int(pad_multiple) != 1:
        stem += f".pad{int(pad_multiple)}"
    return Path(f"{stem}.pieces.npy"), Path(f"{stem}.offsets.npy"), Path(f"{stem}.json")


def write_pack_index(prefix: str | os.PathLike, packing: Packing, pack_size: int) -> None:
    """Write `packing` as the pack index of `prefix`. All three files are written under
    temporary names first and renamed into place only when every one is complete, the JSON
    (which `PackIndex` reads first and checks the arrays against) last; a failed write
    publishes nothing and leaves an existing index as it was."""
    if pack_size != packing.pack_size:
        raise ValueError(
            f"the packing was made for pack size {packing.pack_size}, not {pack_size}; write it "
            f"with pack_size={packing.pack_size}"
        )
    pieces_path, offsets_path, json_path = pack_index_paths(prefix, pack_size,
                                                             packing.pad_multiple)
    pieces = np.stack([packing.doc_ids, packing.starts, packing.lengths], axis=1)
    meta = json.dumps(_index_meta(packing), indent=1).encode()
    writers = [
        (pieces_path, lambda f: np.save(f, pieces)),
        (offsets_path, lambda f: np.save(f, packing.pack_offsets)),
        (json_path, lambda f: f.write(meta)),
    ]
    written: list[tuple[Path, Path]] = []
    try:
        for path, write in writers:
            written.append((path.with_name(f"{path.name}.tmp{os.getpid()}"), path))
            with open(written[-1][0], "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        for temporary, path in written:
            os.replace(temporary, path)
    finally:
        for temporary, _ in written:
            temporary.unlink(missing_ok=True)


def _index_meta(packing: Packing) -> dict:
    padded = {"pad_multiple": packing.pad_multiple} if packing.pad_multiple != 1 else {}
    return {
        "format": INDEX_FORMAT,
        "pack_size": packing.pack_size,
        **padded,  # absent for m = 1: such an index is byte for byte what it always was
        "long_documents": packing.long_documents,
        "seed": packing.seed,
        "pieces": len(packing.doc_ids),
        "packs": len(packing),
        "stats": packing.stats.to_dict(),
    }


class PackIndex:
    """A pack index on disk (see `write_pack_index`), memory-mapped: pages are read when a pack
    is asked for. Pickling (e.g. into data-loader workers) carries only the paths and the
    metadata; the arrays are mapped again on first use. `pack` gives real piece lengths; a row
    built from an index with `pad_multiple` m > 1 pads each piece to a multiple of m
    (`packed_row(..., pad_multiple=index.pad_multiple)`), which the packing left room for.

    Opening it checks everything it holds (`index_problem`), against `document_lengths` (the
    dataset's tokens per document) when given, so a damaged index is refused in one line
    (`ConfigError`) before the first step rather than failing at the step that reads it. With
    `check_pieces=False` only the JSON and the files' headers and sizes are checked: the
    trainer's other ranks, once rank 0 has read the whole index (one pass over the pieces per
    run, not per rank, on a shared file system)."""

    def __init__(self, prefix: str | os.PathLike, pack_size: int, pad_multiple: int = 1,
                 document_lengths: np.ndarray | None = None, check_pieces: bool = True):
        self.pieces_path, self.offsets_path, self.json_path = pack_index_paths(
            prefix, pack_size, pad_multiple)
        self.meta = _read_index_meta(self.json_path, pack_size, pad_multiple)
        self.pad_multiple = pad_multiple
        self.stats = PackingStats(**self.meta["stats"])
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        pieces, offsets = self._mapped()  # fail now, not in the middle of training
        problem = check_pieces and index_problem(pieces, offsets, pack_size, self.stats,
                                                 pad_multiple, document_lengths)
        if problem:
            blamed, what = problem
            path = self.pieces_path if blamed == "pieces" else self.offsets_path
            raise ConfigError(f"pack index file {path} {what}; {REPAIR}")

    def __len__(self) -> int:
        return self.meta["packs"]

    def pack(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document ids, starts, lengths) of pack `i`'s pieces, read-only views."""
        pieces, offsets = self._mapped()
        lo, hi = _pack_bounds(offsets, i, f"pack index {self.json_path}")
        rows = pieces[lo:hi]
        return rows[:, 0], rows[:, 1], rows[:, 2]

    def _mapped(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            pieces = _map_array(self.pieces_path, (self.meta["pieces"], 3))
            offsets = _map_array(self.offsets_path, (self.meta["packs"] + 1,))
            self._arrays = pieces, offsets
        return self._arrays

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}


# What a user does about a damaged pack index (the library-level fix is write_pack_index):
# prepare_data rebuilds every shard's index on each run, and the trainer builds a missing one.
REPAIR = ("re-run scripts/prepare_data.py with the same arguments (it rewrites the index), or "
          "delete the pack index files beside it and the trainer builds them on first use")


class PackIndexFileMissing(ConfigError, FileNotFoundError):
    """A pack index file that is not there: one line like every damaged index (a
    `ConfigError`), and still the `FileNotFoundError` callers of the library catch."""


def _refuse_unless_file(path: Path) -> None:
    """Refuse a pack index file that is missing, or a folder (or anything not a regular file)
    standing where it goes: prepare_data would refuse to write over a folder, so it goes first."""
    if path.is_file():
        return
    if not path.exists():
        raise PackIndexFileMissing(f"pack index file {path} is missing; {REPAIR}")
    raise ConfigError(
        f"pack index file {path} is not a regular file (a folder, or something else, stands "
        f"where the file goes); remove it, then {REPAIR}"
    )


def _read_index_meta(path: Path, pack_size: int, pad_multiple: int) -> dict:
    _refuse_unless_file(path)
    try:
        meta = json.loads(path.read_text())
        names = {f.name for f in fields(PackingStats)}
        valid = (
            meta["format"] == INDEX_FORMAT
            and _is_int(meta["pack_size"])
            and int(meta["pieces"]) >= int(meta["packs"]) >= 1  # no pack is empty
            and set(meta["stats"]) == names
            and all(isinstance(v, int | float) and not isinstance(v, bool)
                    for v in meta["stats"].values())
            and int(meta.get("pad_multiple", 1)) >= 1
        )
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, OSError):
        valid = False
    if not valid:
        raise ConfigError(
            f"pack index file {path} is not a valid {INDEX_FORMAT!r} file; {REPAIR}")
    if meta["pack_size"] != pack_size:  # the file's name says pack_size: edited or renamed
        raise ConfigError(
            f"pack index file {path} is for pack size {meta['pack_size']}, not {pack_size}, "
            f"which its name says: it was edited or renamed; {REPAIR}"
        )
    stored = meta.get("pad_multiple", 1)
    if stored != pad_multiple:
        raise ConfigError(
            f"pack index file {path} pads documents to multiples of {stored}, not "
            f"{pad_multiple}; open it with pad_multiple={stored}, or, if its name is right, it "
            f"was edited or renamed: {REPAIR}"
        )
    return meta


def _map_array(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    _refuse_unless_file(path)
    if problem := npy_problem(path):
        raise ConfigError(f"pack index file {path} {problem}; {REPAIR}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as error:
        raise ConfigError(f"pack index file {path} cannot be mapped ({error}); {REPAIR}") from None
    if array.dtype != np.int64 or array.shape != shape:
        raise ConfigError(
            f"pack index file {path} holds {array.dtype} {array.shape}, expected int64 {shape}; "
            f"{REPAIR}"
        )
    return array


# Pieces checked at a time on opening: bounds the memory of the check (a few arrays of this
# many int64) whatever the index's size.
CHECK_ROWS = 1 << 20


def index_problem(pieces: np.ndarray, offsets: np.ndarray, pack_size: int, stats: PackingStats,
                  pad_multiple: int = 1, document_lengths: np.ndarray | None = None,
                  rows: int = CHECK_ROWS) -> tuple[str, str] | None:
    """The first inconsistency of a pack index's arrays (pieces [n, 3]: document, start,
    length; offsets [packs + 1]) with each other, with its statistics and with the dataset's
    `document_lengths` (when given), as (the file to blame: "pieces" or "offsets", what is
    wrong with it, a predicate: "is damaged: ..."); None when there is none. Reads the
    pieces `rows` at a time."""
    if problem := offsets_problem(offsets, len(pieces), stats.max_pieces_per_pack):
        return "offsets", problem
    tokens = 0
    for first, last in pack_ranges(offsets, rows):
        lo, hi = int(offsets[first]), int(offsets[last])
        chunk = np.asarray(pieces[lo:hi])
        problem = (pieces_problem(chunk, lo, pack_size, document_lengths)
                   or fill_problem(chunk[:, 2], np.asarray(offsets[first:last]) - lo, first,
                                   pack_size, pad_multiple))
        if problem:
            return "pieces", f"is damaged: {problem}"
        tokens += int(chunk[:, 2].sum())
    if tokens != stats.tokens:
        return "pieces", (f"is damaged: its pieces hold {tokens:,} tokens, its JSON says "
                          f"{stats.tokens:,}")
    return None


def offsets_problem(offsets: np.ndarray, pieces: int, max_pieces: int) -> str | None:
    """What is wrong with pack offsets over `pieces` pieces, whose largest pack the JSON says
    holds `max_pieces` (a predicate); None when nothing is. They must start at 0, end at
    `pieces` and rise by at least one piece a pack (no pack is empty)."""
    offsets = np.asarray(offsets)
    if offsets[0] != 0 or offsets[-1] != pieces:
        return (f"does not span its {pieces:,} pieces: its packs run from piece "
                f"{int(offsets[0]):,} to {int(offsets[-1]):,}, not from 0 to {pieces:,}")
    sizes = np.diff(offsets)
    if sizes.min() < 1:
        pack = int(sizes.argmin())
        return (f"is damaged: pack {pack:,} runs from piece {int(offsets[pack]):,} to "
                f"{int(offsets[pack + 1]):,}, and each pack holds at least one piece")
    if sizes.max() != max_pieces:
        return (f"is damaged: its largest pack holds {int(sizes.max()):,} pieces, its JSON says "
                f"{max_pieces:,}")
    return None


def pack_ranges(offsets: np.ndarray, rows: int):
    """Consecutive pack ranges [first, last) of about `rows` pieces each (at least one pack),
    over offsets already known to rise."""
    packs = len(offsets) - 1
    first = 0
    while first < packs:
        last = int(np.searchsorted(offsets, int(offsets[first]) + rows, side="right")) - 1
        last = min(max(last, first + 1), packs)
        yield first, last
        first = last


def pieces_problem(chunk: np.ndarray, first_row: int, pack_size: int,
                   document_lengths: np.ndarray | None = None) -> str | None:
    """What is wrong with pieces (rows: document, start, length; the first is piece
    `first_row`): a document id outside the dataset (or negative without `document_lengths`),
    a start below 0, a length outside 1..pack_size, or a span past its document's end."""
    doc, start, size = chunk[:, 0], chunk[:, 1], chunk[:, 2]
    documents = len(document_lengths) if document_lengths is not None else None
    outside = (doc < 0) if documents is None else (doc < 0) | (doc >= documents)
    if outside.any():
        row = int(outside.argmax())
        among = ("" if documents is None else
                 f", the dataset has {documents:,} (0..{documents - 1:,})")
        return f"piece {first_row + row:,} names document {int(doc[row]):,}{among}"
    bad = (start < 0) | (size < 1) | (size > pack_size)
    if document_lengths is not None and not bad.any():
        own = np.asarray(document_lengths[doc], dtype=np.int64)
        bad = start > own - size  # start + size > own, without overflow
    if bad.any():
        row = int(bad.argmax())
        d, s, n = int(doc[row]), int(start[row]), int(size[row])
        has = "" if document_lengths is None else f", which has {int(document_lengths[d]):,} tokens"
        return (f"piece {first_row + row:,} takes {n:,} tokens from token {s:,} of document "
                f"{d:,}{has} (a piece is 1..{pack_size:,} tokens inside its document)")
    return None


def fill_problem(sizes: np.ndarray, starts: np.ndarray, first_pack: int, pack_size: int,
                 pad_multiple: int = 1) -> str | None:
    """A pack whose pieces (`sizes`, each padded to a multiple of `pad_multiple`) exceed the
    pack size; `starts` are the packs' first rows in `sizes` (rising, the first 0), the first
    pack being pack `first_pack`. Sizes are already known to be 1..pack_size."""
    fills = np.add.reduceat(padded_length(sizes, pad_multiple), starts)
    if fills.max() <= pack_size:
        return None
    pack = int(fills.argmax())
    padded = f" (each piece padded to a multiple of {pad_multiple})" if pad_multiple > 1 else ""
    return (f"pack {first_pack + pack:,} holds {int(fills[pack]):,} tokens{padded}, more than "
            f"the pack size {pack_size:,}")


def build_pack_index(prefix: str | os.PathLike, pack_size: int, *, seed: int = 0,
                     long_documents: str = "split", pad_multiple: int = 1) -> PackingStats:
    """Pack the documents of the Megatron indexed dataset at `prefix` and write the index
    beside it; the one place both data preparation and the trainer build an index."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(prefix))  # kept alive while its mapped lengths are read
    packing = pack_documents(dataset.sequence_lengths, pack_size, seed=seed,
                             long_documents=long_documents, pad_multiple=pad_multiple)
    write_pack_index(prefix, packing, pack_size)
    return packing.stats

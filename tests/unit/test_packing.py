"""Sequence packing: tokens conserved, packs bounded, accounting, determinism, quality, index;
and packing for a pad multiple (context parallel: 2 x CP), read back into padded rows."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.packing import (
    PackIndex,
    _stable_argsort,
    next_fit_pack_count,
    pack_documents,
    pack_index_paths,
    write_pack_index,
)

LENGTHS = st.lists(st.integers(0, 130), min_size=1, max_size=120).filter(any)
PACK_SIZES = st.integers(1, 40)
POLICIES = st.sampled_from(["split", "truncate"])
SEEDS = st.integers(0, 2**32)
PAD_MULTIPLES = st.integers(1, 8)
SLOTS = st.integers(1, 12)  # pack size = pad multiple x slots
EXAMPLES = settings(max_examples=60, deadline=None)


def _lognormal(documents: int, seed: int = 0) -> np.ndarray:
    draws = np.random.default_rng(seed).lognormal(np.log(300.0), 1.0, documents)
    return np.clip(np.rint(draws), 1, 8192).astype(np.int64)


def _pack_fill(packing) -> np.ndarray:
    return np.add.reduceat(packing.lengths, packing.pack_offsets[:-1])


def _packs_as_sets(packing) -> list[tuple]:
    packs = (np.stack(packing.pack(i), axis=1) for i in range(len(packing)))
    return sorted(tuple(map(tuple, rows.tolist())) for rows in packs)


@EXAMPLES
@given(LENGTHS, PACK_SIZES, POLICIES, SEEDS)
def test_every_document_is_rebuilt_exactly_from_its_pieces(lengths, pack_size, policy, seed):
    packing = pack_documents(lengths, pack_size, long_documents=policy, seed=seed)
    spans: dict[int, list[np.ndarray]] = {}
    for doc, start, length in zip(packing.doc_ids, packing.starts, packing.lengths, strict=True):
        spans.setdefault(int(doc), []).append(np.arange(start, start + length))
    assert set(spans) <= set(range(len(lengths)))
    for doc, length in enumerate(lengths):
        kept = length if policy == "split" else min(length, pack_size)
        pieces = sorted(spans.get(doc, []), key=lambda span: span[0])
        rebuilt = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        # No token lost, duplicated or moved: the spans tile the kept tokens in order.
        assert np.array_equal(rebuilt, np.arange(kept)), (doc, length, pieces)
        # Split: pack-sized pieces, then at most one shorter last piece.
        assert all(len(span) == pack_size for span in pieces[:-1])


@EXAMPLES
@given(LENGTHS, PACK_SIZES, POLICIES, SEEDS)
def test_packs_never_overflow_and_are_never_empty(lengths, pack_size, policy, seed):
    packing = pack_documents(lengths, pack_size, long_documents=policy, seed=seed)
    offsets = packing.pack_offsets
    assert offsets[0] == 0 and offsets[-1] == len(packing.doc_ids)
    assert np.all(np.diff(offsets) >= 1)
    assert np.all(packing.lengths >= 1)
    assert np.all(_pack_fill(packing) <= pack_size)
    for i in range(len(packing)):
        doc_ids, _, sizes = packing.pack(i)
        # Placement order: longest first, equal lengths in ascending document id.
        assert np.all(np.diff(sizes) <= 0), sizes
        assert np.all((np.diff(sizes) < 0) | (np.diff(doc_ids) > 0)), (sizes, doc_ids)


@EXAMPLES
@given(LENGTHS, PACK_SIZES)
def test_split_and_truncate_accounting(lengths, pack_size):
    long = [n for n in lengths if n > pack_size]
    split = pack_documents(lengths, pack_size, long_documents="split").stats
    cut = pack_documents(lengths, pack_size, long_documents="truncate").stats
    assert (split.split_documents, split.truncated_documents, split.dropped_tokens) == (
        len(long),
        0,
        0,
    )
    assert split.tokens == sum(lengths)
    assert split.pieces == sum(-(-n // pack_size) for n in lengths)
    assert (cut.split_documents, cut.truncated_documents) == (0, len(long))
    assert cut.dropped_tokens == sum(n - pack_size for n in long)
    assert cut.tokens == sum(min(n, pack_size) for n in lengths)
    assert cut.pieces == sum(1 for n in lengths if n)
    for stats in (split, cut):
        assert stats.documents == len(lengths)
        assert stats.empty_documents == lengths.count(0)
        assert stats.lower_bound == -(-stats.tokens // pack_size) <= stats.packs
        assert stats.efficiency == stats.tokens / (stats.packs * pack_size)
        assert stats.packing_factor == stats.pieces / stats.packs


def _padded(lengths, multiple: int) -> np.ndarray:
    return -(-np.asarray(lengths, np.int64) // multiple) * multiple


def _best_fit_piece_by_piece(lengths: list[int], pack_size: int, multiple: int = 1) -> list[int]:
    """Reference best-fit-decreasing: each piece, longest first, into the fullest pack it fits
    (pieces padded to `multiple` first)."""
    pieces = []
    for n in lengths:
        full, rest = divmod(n, pack_size)
        pieces += [pack_size] * full + ([rest] if rest else [])
    pieces = _padded(pieces, multiple).tolist()
    fills: list[int] = []
    for piece in sorted(pieces, reverse=True):
        fits = [i for i, fill in enumerate(fills) if fill + piece <= pack_size]
        if fits:
            best = max(fits, key=lambda i: fills[i])
            fills[best] += piece
        else:
            fills.append(piece)
    return sorted(fills)


@EXAMPLES
@given(LENGTHS, PACK_SIZES)
def test_bulk_placement_is_exactly_best_fit_decreasing(lengths, pack_size):
    packing = pack_documents(lengths, pack_size)
    expected = _best_fit_piece_by_piece(lengths, pack_size)
    assert sorted(_pack_fill(packing).tolist()) == expected
    assert packing.stats.max_pieces_per_pack == int(np.diff(packing.pack_offsets).max())


def test_seed_fixes_the_pack_order_and_another_seed_changes_it():
    lengths = _lognormal(3000)
    first, again = pack_documents(lengths, 2048, seed=5), pack_documents(lengths, 2048, seed=5)
    for name in ("doc_ids", "starts", "lengths", "pack_offsets"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    other = pack_documents(lengths, 2048, seed=6)
    assert not np.array_equal(first.doc_ids, other.doc_ids)
    assert _packs_as_sets(first) == _packs_as_sets(other)


def _assert_documents_tiled(packing, lengths: np.ndarray) -> None:
    """Vectorised rebuild check for large packings: no pack overflows, and each document's
    pieces, sorted by start, tile its first min(length, kept) tokens without gap or overlap."""
    assert np.all(np.diff(packing.pack_offsets) >= 1)
    assert np.all(_pack_fill(packing) <= packing.pack_size)
    order = np.lexsort((packing.starts, packing.doc_ids))
    doc, start, size = packing.doc_ids[order], packing.starts[order], packing.lengths[order]
    same = doc[1:] == doc[:-1]
    assert np.all(start[1:][same] == (start + size)[:-1][same])
    assert np.all(start[np.r_[True, ~same]] == 0)
    kept = lengths if packing.long_documents == "split" else np.minimum(lengths, packing.pack_size)
    assert np.array_equal(np.bincount(doc, weights=size, minlength=len(lengths)), kept)


@pytest.mark.parametrize("pack_size", [4096, 8192])
def test_quality_near_lower_bound_and_better_than_next_fit(pack_size):
    lengths = _lognormal(20_000, seed=1)
    packing = pack_documents(lengths, pack_size)
    stats = packing.stats
    assert stats.packs <= stats.lower_bound + 1, stats
    assert stats.packs < next_fit_pack_count(lengths, pack_size)
    _assert_documents_tiled(packing, lengths)


@pytest.mark.parametrize("policy", ["split", "truncate"])
def test_many_packs_and_long_documents_stay_exact(policy):
    # Over 65,536 packs (two radix passes when shuffling), many documents longer than the pack.
    lengths = _lognormal(140_000, seed=2)
    lengths[::97] = 0
    packing = pack_documents(lengths, 512, long_documents=policy, seed=9)
    assert len(packing) > 1 << 16
    assert packing.stats.packs <= packing.stats.lower_bound * 1.001, packing.stats
    _assert_documents_tiled(packing, lengths)


@pytest.mark.parametrize(
    ("lengths", "kwargs", "message"),
    [
        ([], {}, "document lengths are empty"),
        ([[1, 2]], {}, r"one-dimensional, got shape \(1, 2\)"),
        ([1.5, 2.0], {}, "must be integers, got dtype float64"),
        ([3, -2], {}, "document 1 has length -2"),
        ([0, 0, 0], {}, "all 3 documents have length 0"),
        ([3], {"pack_size": 0}, "pack_size 0 must be a positive integer"),
        ([3], {"pack_size": -8}, "pack_size -8 must be a positive integer"),
        ([3], {"pack_size": True}, "pack_size True must be a positive integer"),
        ([3], {"pack_size": 1 << 30}, "pack_size 1073741824 is above 16,777,216"),
        ([3], {"long_documents": "drop"}, "long_documents 'drop' is not a policy"),
        ([3], {"seed": -1}, "seed -1 must be a non-negative integer"),
    ],
)
def test_bad_inputs_raise_one_line_errors(lengths, kwargs, message):
    kwargs = {"pack_size": 8, **kwargs}
    with pytest.raises(ValueError, match=message) as error:
        pack_documents(lengths, **kwargs)
    assert "\n" not in str(error.value)


def test_zero_length_documents_are_skipped_and_counted():
    packing = pack_documents([0, 5, 0, 3], 8)
    assert packing.stats.empty_documents == 2
    assert sorted(packing.doc_ids.tolist()) == [1, 3]


def test_packs_wider_than_16_bits():
    lengths = np.array([70_000, 50_000, 30_000, 200_000])
    packing = pack_documents(lengths, 100_000)
    assert packing.stats.packs == packing.stats.lower_bound == 4
    assert sorted(_pack_fill(packing).tolist()) == [50_000, 100_000, 100_000, 100_000]
    _assert_documents_tiled(packing, lengths)


def test_wide_keys_sort_stably_through_radix_passes():
    keys = np.random.default_rng(0).integers(0, 1 << 20, 50_000)
    assert np.array_equal(_stable_argsort(keys, 1 << 20), np.argsort(keys, kind="stable"))


def _written(tmp_path, pack_size=1024):
    packing = pack_documents(_lognormal(2000), pack_size, seed=3)
    prefix = tmp_path / "corpus_text_document"
    write_pack_index(prefix, packing, pack_size)
    return packing, prefix


def test_pack_index_round_trip(tmp_path):
    packing, prefix = _written(tmp_path)
    index = PackIndex(prefix, 1024)
    assert sorted(tmp_path.iterdir()) == sorted(pack_index_paths(prefix, 1024))
    assert pack_index_paths(prefix, 1024)[0].name == "corpus_text_document.pack1024.pieces.npy"
    assert len(index) == len(packing) and index.stats == packing.stats
    reopened = pickle.loads(pickle.dumps(index))
    for i in range(len(packing)):
        for got, copy, want in zip(index.pack(i), reopened.pack(i), packing.pack(i), strict=True):
            assert np.array_equal(got, want) and np.array_equal(copy, want), i
    with pytest.raises(IndexError, match=f"pack {len(packing)} is out of range"):
        index.pack(len(packing))


def test_a_failed_write_publishes_nothing_and_keeps_the_old_index(tmp_path, monkeypatch):
    packing, prefix = _written(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}
    save = np.save

    def save_then_fail_on_offsets(file, array):
        if array.ndim == 1:
            raise OSError("disk full")
        save(file, array)

    monkeypatch.setattr(np, "save", save_then_fail_on_offsets)
    with pytest.raises(OSError, match="disk full"):
        write_pack_index(prefix, pack_documents(_lognormal(500, seed=4), 1024), 1024)
    assert {path: path.read_bytes() for path in tmp_path.iterdir()} == before
    assert np.array_equal(PackIndex(prefix, 1024).pack(0)[0], packing.pack(0)[0])


def test_truncated_or_missing_index_files_give_one_line_errors(tmp_path):
    _, prefix = _written(tmp_path)
    pieces, offsets, meta = pack_index_paths(prefix, 1024)
    whole = pieces.read_bytes()
    pieces.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=f"pack index file {pieces} is damaged: it is .* bytes"):
        PackIndex(prefix, 1024)
    pieces.write_bytes(whole)
    PackIndex(prefix, 1024)
    np.save(offsets, np.load(offsets) + 1)  # right shape and type, wrong span
    with pytest.raises(ValueError, match=f"pack index file {offsets} does not span"):
        PackIndex(prefix, 1024)
    offsets.unlink()
    with pytest.raises(FileNotFoundError, match=f"{offsets} is missing"):
        PackIndex(prefix, 1024)
    meta.write_text('{"format": ')
    with pytest.raises(ValueError, match=f"pack index file {meta} is not a valid") as error:
        PackIndex(prefix, 1024)
    assert "\n" not in str(error.value)


def test_index_refuses_a_different_pack_size(tmp_path):
    packing, prefix = _written(tmp_path)
    with pytest.raises(ValueError, match="made for pack size 1024, not 2048"):
        write_pack_index(prefix, packing, 2048)
    meta = pack_index_paths(prefix, 1024)[2]
    meta.rename(pack_index_paths(prefix, 2048)[2])
    with pytest.raises(ValueError, match="is for pack size 1024, not 2048"):
        PackIndex(prefix, 2048)


# ----------------------------------------------------------------------------- pad multiples

# sha256 of the three index files of `_written` (lognormal 2000, pack 1024, seed 3) as the packer
# wrote them before pad multiples existed: an m = 1 index must stay byte for byte the same.
M1_INDEX_SHA256 = "92b36b1264afcab336ee2a1170d938e4627bd0f402bc37aeb2771448bb086dc1"


@EXAMPLES
@given(LENGTHS, PAD_MULTIPLES, SLOTS, POLICIES, SEEDS)
def test_padded_packing_places_every_token_once_and_padded_packs_fit(
    lengths, multiple, slots, policy, seed
):
    pack_size = multiple * slots
    packing = pack_documents(lengths, pack_size, long_documents=policy, seed=seed,
                             pad_multiple=multiple)
    assert packing.pad_multiple == multiple
    # Every kept token of every document in exactly one piece, pieces tiling their document.
    _assert_documents_tiled(packing, np.asarray(lengths))
    # Each piece padded to the multiple: every pack still fits, and no pack is empty.
    padded = np.add.reduceat(_padded(packing.lengths, multiple), packing.pack_offsets[:-1])
    assert np.all(padded <= pack_size), padded
    assert packing.stats.tokens == int(packing.lengths.sum())
    # Split pieces other than a document's last are pack-sized: multiples of m, no padding.
    order = np.lexsort((packing.starts, packing.doc_ids))
    doc = packing.doc_ids[order]
    not_last = np.r_[doc[1:] == doc[:-1], False]
    assert np.all(packing.lengths[order][not_last] == pack_size)


@EXAMPLES
@given(LENGTHS, PAD_MULTIPLES, SLOTS)
def test_padded_placement_is_exactly_best_fit_decreasing_on_padded_lengths(
    lengths, multiple, slots
):
    pack_size = multiple * slots
    packing = pack_documents(lengths, pack_size, pad_multiple=multiple)
    fills = np.add.reduceat(_padded(packing.lengths, multiple), packing.pack_offsets[:-1])
    assert sorted(fills.tolist()) == _best_fit_piece_by_piece(lengths, pack_size, multiple)


@EXAMPLES
@given(LENGTHS, PAD_MULTIPLES, SLOTS, POLICIES, SEEDS)
def test_lengths_already_multiples_pack_exactly_as_without_padding(
    lengths, multiple, slots, policy, seed
):
    """Packing in slots of m is packing the padded lengths in tokens: when no document needs
    padding, the packing is the m = 1 packing, piece for piece and in the same order."""
    scaled = [multiple * n for n in lengths]
    padded = pack_documents(scaled, multiple * slots, long_documents=policy, seed=seed,
                            pad_multiple=multiple)
    plain = pack_documents(scaled, multiple * slots, long_documents=policy, seed=seed)
    for name in ("doc_ids", "starts", "lengths", "pack_offsets", "stats"):
        assert np.array_equal(getattr(padded, name), getattr(plain, name)), name


def test_an_m1_index_keeps_its_name_and_bytes(tmp_path):
    packing, prefix = _written(tmp_path)
    assert packing.pad_multiple == 1
    paths = pack_index_paths(prefix, 1024, 1)
    assert paths == pack_index_paths(prefix, 1024)
    assert "pad_multiple" not in json.loads(paths[2].read_text())
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()
    assert digest == M1_INDEX_SHA256


def test_padded_index_has_its_own_name_and_refuses_another_multiple(tmp_path):
    prefix = tmp_path / "corpus_text_document"
    packing = pack_documents(_lognormal(500), 1024, seed=3, pad_multiple=8)
    write_pack_index(prefix, packing, 1024)
    paths = pack_index_paths(prefix, 1024, 8)
    assert sorted(tmp_path.iterdir()) == sorted(paths)
    assert paths[0].name == "corpus_text_document.pack1024.pad8.pieces.npy"
    assert json.loads(paths[2].read_text())["pad_multiple"] == 8
    index = PackIndex(prefix, 1024, 8)
    assert index.pad_multiple == 8 and index.stats == packing.stats
    for got, want in zip(index.pack(0), packing.pack(0), strict=True):
        assert np.array_equal(got, want)
    with pytest.raises(FileNotFoundError, match=r"pack1024\.json is missing"):
        PackIndex(prefix, 1024)
    for padded, plain in zip(paths, pack_index_paths(prefix, 1024), strict=True):
        padded.rename(plain)
    with pytest.raises(ValueError, match="pads documents to multiples of 8, not 1; open it with "
                       "pad_multiple=8") as error:
        PackIndex(prefix, 1024)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pad_multiple": 0}, "pad_multiple 0 must be a positive integer"),
        ({"pad_multiple": -4}, "pad_multiple -4 must be a positive integer"),
        ({"pad_multiple": True}, "pad_multiple True must be a positive integer"),
        ({"pad_multiple": 2.0}, "pad_multiple 2.0 must be a positive integer"),
        ({"pack_size": 30, "pad_multiple": 4},
         "pack_size 30 is not a multiple of pad_multiple 4; use a pack size divisible by it, "
         "e.g. 28"),
        ({"pack_size": 2, "pad_multiple": 4}, "e.g. 4$"),
    ],
)
def test_bad_pad_multiples_raise_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        pack_documents([3, 5], **{"pack_size": 8, **kwargs})
    assert "\n" not in str(error.value)


class _Documents:
    """What PackedSamples reads from an indexed dataset: `get(document, offset, length)`."""

    def __init__(self, documents: list[np.ndarray]):
        self.documents = documents

    def get(self, i: int, offset: int, length: int) -> np.ndarray:
        return self.documents[i][offset : offset + length]


def test_rows_of_a_padded_index_pad_each_document_and_hold_every_token_once(tmp_path):
    """The trainer's read-back (`PackedSamples` over a `PackIndex` for m = 4): each piece's real
    tokens start its segment, the segment is the piece padded to the next multiple of m, the
    padding carries no loss, and every token of every document is in exactly one row."""
    from trainer.data import PackedSamples, SourcePacks

    multiple, seq = 4, 64
    lengths = np.random.default_rng(5).integers(1, 150, 300)  # some longer than a row: split
    ends = np.cumsum(lengths)
    documents = [np.arange(end - n, end) + 1 for n, end in zip(lengths, ends, strict=True)]
    write_pack_index(tmp_path / "c", pack_documents(lengths, seq, seed=1, pad_multiple=multiple),
                     seq)
    index = PackIndex(tmp_path / "c", seq, multiple)
    order = (np.zeros(len(index), np.int16), np.arange(len(index)))  # its packs, in order
    rows = PackedSamples([SourcePacks.of([(_Documents(documents), index)])], order, seq, eod=0,
                         pad_multiple=multiple)
    seen, loss_tokens = [], 0
    for i in range(len(rows)):
        row = rows.microbatch(np.array([i]))
        bounds, own = row["cu_seqlens_padded"].tolist(), row["cu_seqlens"].tolist()
        tokens, mask = row["tokens"][0].numpy(), row["loss_mask"][0].numpy()
        assert bounds[-1] == seq
        for d in range(len(index.pack(i)[0])):
            start, end, real = bounds[d], bounds[d + 1], own[d + 1] - own[d]
            assert (end - start) % multiple == 0 and 0 <= end - start - real < multiple
            seen.append(tokens[start : start + real])
            assert np.all(tokens[start + real : end] == 0)
            padding = end - start - real
            assert mask[start:end].tolist() == [1.0] * (real - 1) + [0.0] * (padding + 1)
        loss_tokens += int(mask.sum())
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(1, ends[-1] + 1))
    assert loss_tokens == int(ends[-1]) - len(seen)  # each piece's tokens minus one


def test_packed_data_under_context_parallel_validates_and_pads_to_2cp():
    from plugins.protocol.packed_batch import document_pad_multiple
    from recipes.config.overrides import apply_overrides
    from recipes.config.validation import failing_rules
    from recipes.registry import get_recipe

    packed = ["data.source=blend", "data.blend=conf/data/python_stdlib.yaml",
              "data.documents=packed", "train.micro_batch_size=1"]
    for recipe, multiple in (("tiny_dp1", 1), ("tiny_cp2", 4), ("tiny_cp4", 8)):
        cfg = apply_overrides(get_recipe(recipe), packed)
        assert failing_rules(cfg) == [], recipe
        assert document_pad_multiple(cfg.parallel.context) == multiple

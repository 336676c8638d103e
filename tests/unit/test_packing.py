"""Sequence packing: tokens conserved, packs bounded, accounting, determinism, quality, index."""

from __future__ import annotations

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


def _best_fit_piece_by_piece(lengths: list[int], pack_size: int) -> list[int]:
    """Reference best-fit-decreasing: each piece, longest first, into the fullest pack it fits."""
    pieces = []
    for n in lengths:
        full, rest = divmod(n, pack_size)
        pieces += [pack_size] * full + ([rest] if rest else [])
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
    with pytest.raises(ValueError, match=f"pack index file {pieces} is corrupt or truncated"):
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

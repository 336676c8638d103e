"""A damaged pack index (data_prep/packing.py) is refused when it is opened, in one line naming the
file and the fix, never at the step that reads a garbled piece: each check fires alone here."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from data_prep.packing import (
    REPAIR,
    PackIndex,
    PackingStats,
    fill_problem,
    index_problem,
    offsets_problem,
    pack_documents,
    pack_index_paths,
    pack_ranges,
    pieces_problem,
    write_pack_index,
)
from plugins.protocol.errors import ConfigError

PACK = 128


def _lengths(documents: int = 400, seed: int = 0) -> np.ndarray:
    draws = np.random.default_rng(seed).lognormal(np.log(40.0), 1.0, documents)
    return np.clip(np.rint(draws), 1, 400).astype(np.int64)


def _written(tmp_path: Path, pad_multiple: int = 1):
    lengths = _lengths()
    packing = pack_documents(lengths, PACK, seed=1, pad_multiple=pad_multiple)
    prefix = tmp_path / "good_a"
    write_pack_index(prefix, packing, PACK)
    return prefix, lengths, packing


def _refused(prefix, lengths=None, pad_multiple: int = 1) -> str:
    with pytest.raises(ConfigError) as error:
        PackIndex(prefix, PACK, pad_multiple, document_lengths=lengths)
    message = str(error.value)
    assert "\n" not in message and message.endswith(REPAIR), message
    return message


def _pieces(packing) -> np.ndarray:
    return np.stack([packing.doc_ids, packing.starts, packing.lengths], axis=1)


def _stats(packing, **changes) -> PackingStats:
    return PackingStats(**{**packing.stats.to_dict(), **changes})


# ------------------------------------------------------------------------- whole indexes


@pytest.mark.parametrize("multiple", [1, 4])
def test_a_whole_index_opens_against_its_documents(tmp_path, multiple):
    prefix, lengths, packing = _written(tmp_path, multiple)
    index = PackIndex(prefix, PACK, multiple, document_lengths=lengths)
    assert len(index) == len(packing)
    assert index_problem(_pieces(packing), packing.pack_offsets, PACK, packing.stats,
                         multiple, lengths, rows=7) is None


def test_pack_ranges_cover_every_pack_once_in_chunks():
    offsets = np.array([0, 3, 4, 9, 10, 30, 31])  # packs of 3, 1, 5, 1, 20 and 1 pieces
    # as many whole packs as fit 5 pieces; a pack larger than a chunk is a chunk of its own
    assert list(pack_ranges(offsets, 5)) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    assert list(pack_ranges(offsets, 31)) == [(0, 6)]


def test_a_problem_in_a_later_chunk_names_its_piece_and_pack():
    lengths = _lengths()
    packing = pack_documents(lengths, PACK, seed=1)
    pieces = _pieces(packing)
    last = len(pieces) - 1
    pieces[last, 0] = len(lengths)
    whole = index_problem(pieces, packing.pack_offsets, PACK, packing.stats, 1, lengths)
    chunked = index_problem(pieces, packing.pack_offsets, PACK, packing.stats, 1, lengths, rows=3)
    assert whole == chunked == ("pieces", f"is damaged: piece {last:,} names document "
                                f"{len(lengths)}, the dataset has 400 (0..399)")


# ------------------------------------------------------------------------------ the pieces


def test_a_document_id_beyond_the_dataset():
    problem = pieces_problem(np.array([[0, 0, 5], [9, 0, 5]]), 10, PACK, np.array([5, 5]))
    assert problem == "piece 11 names document 9, the dataset has 2 (0..1)"


def test_a_negative_document_id_without_the_dataset():
    assert pieces_problem(np.array([[-3, 0, 5]]), 0, PACK) == "piece 0 names document -3"


def test_a_span_past_its_documents_end():
    problem = pieces_problem(np.array([[1, 4, 5]]), 0, PACK, np.array([5, 8]))
    assert problem == ("piece 0 takes 5 tokens from token 4 of document 1, which has 8 tokens "
                       f"(a piece is 1..{PACK} tokens inside its document)")


@pytest.mark.parametrize("row", [[0, -1, 5], [0, 0, 0], [0, 0, PACK + 1]])
def test_a_negative_start_an_empty_piece_or_one_longer_than_the_pack(row):
    assert "tokens inside its document" in pieces_problem(np.array([row]), 0, PACK)


def test_a_huge_length_does_not_overflow_the_span_check():
    chunk = np.array([[0, 3, np.iinfo(np.int64).max]])
    assert "takes 9,223,372,036,854,775,807 tokens" in pieces_problem(chunk, 0, PACK,
                                                                     np.array([10]))


def test_a_pack_over_the_pack_size():
    problem = fill_problem(np.array([60, 60, 10, 100]), np.array([0, 3]), 5, PACK)
    assert problem == f"pack 5 holds 130 tokens, more than the pack size {PACK}"


def test_a_pack_over_the_pack_size_once_its_pieces_are_padded():
    assert fill_problem(np.array([63, 63]), np.array([0]), 0, 126) is None
    assert fill_problem(np.array([63, 63]), np.array([0]), 0, 126, 4) == (
        "pack 0 holds 128 tokens (each piece padded to a multiple of 4), more than the pack "
        "size 126")


def test_token_count_against_the_json():
    packing = pack_documents(_lengths(), PACK, seed=1)
    problem = index_problem(_pieces(packing), packing.pack_offsets, PACK,
                            _stats(packing, tokens=packing.stats.tokens + 1))
    assert problem == ("pieces", f"is damaged: its pieces hold {packing.stats.tokens:,} tokens, "
                       f"its JSON says {packing.stats.tokens + 1:,}")


# ----------------------------------------------------------------------------- the offsets


def test_offsets_that_do_not_start_at_0_or_end_at_the_pieces():
    assert offsets_problem(np.array([1, 3, 5]), 5, 2) == (
        "does not span its 5 pieces: its packs run from piece 1 to 5, not from 0 to 5")
    assert "run from piece 0 to 4, not from 0 to 5" in offsets_problem(np.array([0, 2, 4]), 5, 2)


def test_offsets_that_fall_or_leave_a_pack_empty():
    assert offsets_problem(np.array([0, 4, 2, 5]), 5, 3) == (
        "is damaged: pack 1 runs from piece 4 to 2, and each pack holds at least one piece")
    assert "pack 0 runs from piece 0 to 0" in offsets_problem(np.array([0, 0, 5]), 5, 5)


def test_offsets_whose_largest_pack_disagrees_with_the_json():
    assert offsets_problem(np.array([0, 1, 5]), 5, 3) == (
        "is damaged: its largest pack holds 4 pieces, its JSON says 3")


# Random bytes after an intact header: before, a pieces body ended training in an IndexError and an
# offsets body sent a pack of 43,646 tokens to `packed_row`, mid-training.
@pytest.mark.parametrize(("which", "said"), [(0, "is damaged: piece "), (1, "")],
                         ids=["pieces", "offsets"])
def test_a_garbled_body_is_refused_on_opening(tmp_path, which, said):
    prefix, lengths, _ = _written(tmp_path)
    path = pack_index_paths(prefix, PACK)[which]
    data = bytearray(path.read_bytes())
    data[200:400] = np.random.default_rng(which + 1).bytes(200)
    path.write_bytes(bytes(data))
    assert _refused(prefix, lengths).startswith(f"pack index file {path} {said}")


# --------------------------------------------------------------------------- the files


def test_an_empty_offsets_file(tmp_path):
    prefix, lengths, _ = _written(tmp_path)
    offsets = pack_index_paths(prefix, PACK)[1]
    offsets.write_bytes(b"")
    assert _refused(prefix, lengths).startswith(
        f"pack index file {offsets} is damaged: its numpy header cannot be read (")


def test_a_missing_pieces_file_is_one_line_and_still_file_not_found(tmp_path):
    prefix, lengths, _ = _written(tmp_path)
    pieces = pack_index_paths(prefix, PACK)[0]
    pieces.unlink()
    with pytest.raises(FileNotFoundError):
        PackIndex(prefix, PACK)
    assert _refused(prefix, lengths) == f"pack index file {pieces} is missing; {REPAIR}"


def test_a_folder_where_the_pieces_file_goes(tmp_path):
    prefix, lengths, _ = _written(tmp_path)
    pieces = pack_index_paths(prefix, PACK)[0]
    pieces.unlink()
    pieces.mkdir()
    assert _refused(prefix, lengths).startswith(
        f"pack index file {pieces} is not a regular file (a folder, or something else, stands "
        "where the file goes); remove it, then re-run")


def test_bytes_after_an_array(tmp_path):
    prefix, lengths, _ = _written(tmp_path)
    pieces = pack_index_paths(prefix, PACK)[0]
    whole = pieces.read_bytes()
    pieces.write_bytes(whole + b"\0" * 24)
    assert _refused(prefix, lengths).startswith(
        f"pack index file {pieces} is damaged: it is {len(whole) + 24:,} bytes, but its header "
        f"(int64 (")


def test_an_edited_pack_size_in_the_json(tmp_path):
    prefix, lengths, _ = _written(tmp_path)
    meta_path = pack_index_paths(prefix, PACK)[2]
    meta = json.loads(meta_path.read_text())
    meta["pack_size"] = 64
    meta_path.write_text(json.dumps(meta))
    assert _refused(prefix, lengths).startswith(
        f"pack index file {meta_path} is for pack size 64, not {PACK}, which its name says: it "
        "was edited or renamed; ")


@pytest.mark.parametrize("edit", [
    {"pack_size": "128"}, {"packs": 0}, {"pieces": 1}, {"stats": {"tokens": "many"}},
    {"stats": [f.name for f in fields(PackingStats)]}])
def test_json_values_of_the_wrong_kind(tmp_path, edit):
    prefix, lengths, _ = _written(tmp_path)
    meta_path = pack_index_paths(prefix, PACK)[2]
    meta = json.loads(meta_path.read_text())
    if isinstance(edit.get("stats"), dict):
        meta["stats"].update(edit["stats"])
    else:
        meta.update(edit)
    meta_path.write_text(json.dumps(meta))
    assert _refused(prefix, lengths).startswith(f"pack index file {meta_path} is not a valid ")

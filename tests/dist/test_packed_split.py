"""A packed blend held out by `split:` holds out each source's last packs (Megatron splits each
dataset before blending), so however often the weights repeat a source's packs in training,
no held-out row is a pack trained on; `data.pack_order=v1` kept its tail-of-the-order split
(runs saved under it resume so)."""

from __future__ import annotations

import pytest

from tests.dist.prepared_data import write_byte_dataset

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.prepared_data:packed_rows_of"


def _blend(tmp_path) -> str:
    small = write_byte_dataset(tmp_path, "small", max_bytes=30_000, seed=1)
    large = write_byte_dataset(tmp_path, "large", max_bytes=120_000, seed=2)
    path = tmp_path / "weighted.yaml"
    path.write_text(f"train:\n  - {{prefix: {small}, weight: 0.6}}\n"
                    f"  - {{prefix: {large}, weight: 0.4}}\nsplit: [80, 20]\n"
                    "eod_id: 0\nvocab_size: 256\n", encoding="utf-8")
    return str(path)


def test_no_pack_is_both_trained_on_and_held_out(launch_ranks, tmp_path):
    [[rows, v1]] = launch_ranks(1, ENTRY, {
        "blend": _blend(tmp_path), "cache": str(tmp_path / "cache"),
        "runs": [["model.seq_length=128"], ["model.seq_length=128", "data.pack_order=v1"]]})
    train, heldout = {tuple(r) for r in rows["train"]}, {tuple(r) for r in rows["heldout"]}
    assert train and heldout and not train & heldout
    for source, count in enumerate(rows["counts"]):
        bookend = round(count * 0.8)  # Megatron's: the first 80 % of each source's packs train
        assert {p for s, p in train if s == source} <= set(range(bookend))
        assert {p for s, p in heldout if s == source} <= set(range(bookend, count))
    small_share = sum(1 for s, _ in rows["train"] if s == 0) / len(rows["train"])
    assert abs(small_share - 0.6) * len(rows["train"]) <= 1  # the weights, within a row
    repeated = len(rows["train"]) - len(train)
    assert repeated > 0  # the small source's packs repeat in training, none of them held out
    assert {tuple(r) for r in v1["train"]} & {tuple(r) for r in v1["heldout"]}  # the old split

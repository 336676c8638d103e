"""A phase whose rows mix document lengths, as Nemotron 3 Nano's long-context phase mixes 512k-token
and 4k-token sequences: the phase packs whole documents of a blend of long and short documents
into long rows (`documents: packed`), each document attending to itself only.

CPU-sized: a run of 64-token concatenated rows for 2 steps, then a relaunched phase of packed
256-token rows (micro-batch 1) over a blend of long (150-250 tokens) and short (8-16 tokens)
documents. Shown: `scripts/pretrain.py` trains both phases, launching the second itself in its
own rows (`data.documents=packed train.micro_batch_size=1`), and the second phase takes tokens
from both sources; in that phase's rows every document is attended to alone: each row's summed
loss equals its documents' alone (and a control, the same row with causal attention across it,
differs wherever a row holds several documents). The packer fills rows best-fit-decreasing, so
a long document's row is topped up with short ones: each still attends to itself only.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.dist.mixed_length_runs import LONG_SEQ, SHORT_SEQ, write_mixed_blend
from tests.dist.test_phase_relaunch import fork_launches

pytestmark = pytest.mark.dist

ROWS = "tests.dist.mixed_length_runs:rows_attend_per_document"
STEPS, BOUNDARY = 4, 2
LOSS_REL_TOLERANCE = 1e-6  # fp32 on CPU: the two differ only in summation order


def _argv(blend: str) -> list[str]:
    return ["recipe=tiny_dp1", "data.source=blend", f"data.blend={blend}",
            f"train.train_iters={STEPS}", "scheduler.warmup_iters=1", "train.eval_iters=0",
            "train.eval_interval=0", "logging.progress_bar=false",
            "plugins.logging.loss_curve=false", f"model.seq_length={SHORT_SEQ}",
            f"phases=[{{name: pretraining, end_step: {BOUNDARY}, seq_length: {SHORT_SEQ}, "
            f"documents: concatenate}}, {{name: long_context, end_step: {STEPS}, seq_length: "
            f"{LONG_SEQ}, documents: packed, micro_batch_size: 1, relaunch: true}}]"]


def test_a_packed_phase_of_mixed_lengths_trains_after_the_first(launch_ranks, tmp_path,
                                                                 monkeypatch, capsys):
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.contract import parse_arguments

    blend = write_mixed_blend(tmp_path / "data", weights=(1.0, 3.0))  # the mix: 1 long : 3 short
    launches = fork_launches(launch_ranks, monkeypatch)
    run_dir = tmp_path / "run"
    assert PRETRAIN.run(parse_arguments(PRETRAIN, [*_argv(blend), f"run_dir={run_dir}"])) == 0
    out = capsys.readouterr().out
    assert len(launches) == 2
    assert "data.documents=packed train.micro_batch_size=1" in out  # the second launch's rows
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(line) for line in lines if '"kind": "train"' in line]
    assert [r["phase_name"] for r in train] == ["pretraining"] * BOUNDARY + [
        "long_context"] * (STEPS - BOUNDARY)
    assert all(math.isfinite(r["loss"]) for r in train)
    before, after = train[BOUNDARY - 1]["source_tokens"], train[-1]["source_tokens"]
    assert all(after[name] > before.get(name, 0) for name in ("long", "short"))
    # the rows' order, written once beside Megatron's index cache, by the blend's weights and
    # Megatron's rule (data.pack_order=v1 would give [1, 0, 1, 1, 1, 0])
    # (one order for the training rows, one for the held-out: each source's last packs)
    orders = [np.load(path, mmap_mode="r")
              for path in (run_dir / "data_index").glob("pack_order-*-sources.npy")]
    assert len(orders) == 2
    sources = max(orders, key=len)
    assert sources[:6].tolist() == [1, 0, 1, 1, 0, 1]
    assert abs(int((sources == 1).sum()) - 0.75 * len(sources)) <= 1


def test_each_document_of_a_mixed_row_attends_to_itself(launch_ranks, tmp_path):
    blend = write_mixed_blend(tmp_path / "data")
    [result] = launch_ranks(1, ROWS, {"argv": _argv(blend), "run_dir": str(tmp_path / "rows")})
    assert result["phase"] == {"seq_length": LONG_SEQ, "documents": "packed",
                               "micro_batch_size": 1}
    assert "packing" in result["plugins"]
    rows = result["rows"]
    lengths = [n for r in rows for n in r["lengths"]]
    assert all(n <= 16 or n >= 150 for n in lengths)  # every document is one of the two kinds
    assert any(n >= 150 for n in lengths) and any(n <= 16 for n in lengths)
    assert any(len(r["lengths"]) > 2 for r in rows)  # rows holding several documents
    for row in rows:
        packed, alone = row["packed"], row["alone"]
        assert packed[1] == alone[1] == sum(n - 1 for n in row["lengths"])  # loss tokens
        assert abs(packed[0] - alone[0]) <= LOSS_REL_TOLERANCE * abs(alone[0])
        if len(row["lengths"]) > 1:  # control: attention across documents is another loss
            assert abs(row["causal_only"][0] - alone[0]) > 100 * LOSS_REL_TOLERANCE * alone[0]

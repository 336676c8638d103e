"""The packed micro-batch format, the packing plugin's rules and THD parameters, and the CPU
backend's document mask and spec swap (the numerics are in tests/dist/test_packed_equivalence.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plugins.packing.config import check_packing_context_parallel, check_packing_micro_batch
from plugins.packing.plugin import PackingPlugin
from plugins.protocol.errors import UserError
from plugins.protocol.packed_batch import PACKED_KEYS, packed_row
from plugins.registry import build_plugins
from recipes.config.overrides import apply_overrides
from recipes.config.validation import failing_rules, validate
from recipes.registry import get_recipe
from trainer.cpu_runtime.packed_attention import document_causal_mask, use_packed_attention
from trainer.data import as_tensors

SEQ = 32
PAD = 0
LENGTHS = (7, 12, 9)  # + 4 padding tokens


def _documents(lengths=LENGTHS) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1, 256, size=n) for n in lengths]


def _segment_of(cu_seqlens: torch.Tensor, length: int) -> list[int]:
    bounds = cu_seqlens.tolist()
    return [next(s for s in range(len(bounds) - 1) if bounds[s] <= i < bounds[s + 1])
            for i in range(length)]


def test_packed_row_has_the_documented_fields_shapes_and_dtypes():
    row = as_tensors(packed_row(_documents(), SEQ, PAD))  # as the trainer hands it to the model
    assert tuple(row) == PACKED_KEYS
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert row[key].shape == (1, SEQ), key
    assert row["tokens"].dtype == row["labels"].dtype == row["position_ids"].dtype == torch.long
    assert row["loss_mask"].dtype == torch.float32
    assert row["cu_seqlens"].dtype == torch.int32 and row["cu_seqlens"].dim() == 1
    assert row["cu_seqlens"].tolist() == [0, 7, 19, 28, 32]  # padding is a segment of its own
    assert type(row["max_seqlen"]) is int and row["max_seqlen"] == 12  # longest document
    assert type(row["documents"]) is int and row["documents"] == 3  # the padding is not one


def test_labels_never_cross_a_document_boundary():
    docs = _documents()
    row = packed_row(docs, SEQ, PAD)
    tokens, labels = row["tokens"][0], row["labels"][0]
    mask = row["loss_mask"][0]
    segment = _segment_of(row["cu_seqlens"], SEQ)
    for i in range(SEQ):
        if mask[i]:
            assert i + 1 < SEQ and segment[i + 1] == segment[i]
            assert labels[i] == tokens[i + 1]
    # Each document of n tokens gives n - 1 loss tokens; its last position none.
    ends = row["cu_seqlens"].tolist()[1:4]
    assert [float(mask[end - 1]) for end in ends] == [0.0, 0.0, 0.0]
    assert int(mask.sum()) == sum(n - 1 for n in LENGTHS)
    start = 0
    for doc in docs:
        assert tokens[start : start + len(doc)].tolist() == doc.tolist()
        start += len(doc)


def test_positions_restart_per_segment_and_padding_carries_no_loss():
    row = packed_row(_documents(), SEQ, PAD)
    expected = [*range(7), *range(12), *range(9), *range(4)]
    assert row["position_ids"][0].tolist() == expected
    assert row["tokens"][0, 28:].tolist() == [PAD] * 4
    assert row["loss_mask"][0, 28:].tolist() == [0.0] * 4


def test_full_row_has_no_padding_segment_and_long_padding_sets_max_seqlen():
    full = packed_row(_documents((20, 12)), SEQ, PAD)
    assert full["cu_seqlens"].tolist() == [0, 20, 32] and int(full["max_seqlen"]) == 20
    # max_seqlen must cover every segment, padding included, or RoPE cannot slice its table.
    short = packed_row(_documents((3, 5)), SEQ, PAD)
    assert short["cu_seqlens"].tolist() == [0, 3, 8, 32] and int(short["max_seqlen"]) == 24
    assert int(short["max_seqlen"]) < SEQ  # never the row length with two or more segments


@pytest.mark.parametrize(("lengths", "message"), [
    ((20, 13), "documents of 33 tokens do not fit a row of seq_length=32; pack fewer"),
    ((5, 0), "document 1 is empty; drop empty documents before packing"),
])
def test_packed_row_refuses_what_does_not_fit(lengths, message):
    docs = [np.arange(1, n + 1) for n in lengths]
    with pytest.raises(ValueError, match=message):
        packed_row(docs, SEQ, PAD)


def test_document_mask_is_one_causal_block_per_segment():
    cu_seqlens = torch.tensor([0, 7, 19, 28, 32], dtype=torch.int32)
    mask = document_causal_mask(cu_seqlens, SEQ)
    assert mask.shape == (1, 1, SEQ, SEQ) and mask.dtype == torch.bool
    segment = _segment_of(cu_seqlens, SEQ)
    expected = torch.tensor([[not (segment[i] == segment[j] and j <= i) for j in range(SEQ)]
                             for i in range(SEQ)])
    assert torch.equal(mask[0, 0], expected)


@pytest.mark.parametrize("bad", [[1, 7, 32], [0, 7, 30], [0, 19, 7, 32]])
def test_document_mask_refuses_boundaries_that_do_not_cover_the_row(bad):
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, never decrease and end at"):
        document_causal_mask(torch.tensor(bad, dtype=torch.int32), SEQ)


def test_forward_kwargs_carry_thd_params_and_no_dense_mask():
    row = as_tensors(packed_row(_documents(), SEQ, PAD))
    base = {"input_ids": row["tokens"], "attention_mask": torch.ones(1), "labels": row["labels"]}
    kwargs = PackingPlugin(mamba_layers=False).forward_kwargs(row, base)
    params = kwargs["packed_seq_params"]
    assert kwargs["attention_mask"] is None
    assert kwargs["input_ids"] is row["tokens"] and kwargs["labels"] is row["labels"]
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.dtype == torch.int32
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 7, 19, 28, 32]
    assert params.max_seqlen_q == params.max_seqlen_kv == 12
    assert type(params.max_seqlen_q) is int  # the rotary table's lru_cache key
    # No Mamba layers: no per-document index (building it would read a GPU back every batch).
    assert params.total_tokens is None and params.seq_idx is None


def test_a_hybrid_run_gets_the_mamba_document_index_from_the_rows_plain_length():
    from pathlib import Path

    from plugins.protocol.events import RunStart

    row = as_tensors(packed_row(_documents(), SEQ, PAD))
    assert type(row["total_tokens"]) is int and row["total_tokens"] == SEQ
    plugin = PackingPlugin(mamba_layers=False)
    plugin.run_start(RunStart(get_recipe("hybrid_tiny_dp1"), Path("."), 0, 1))
    params = plugin.forward_kwargs(row, {})["packed_seq_params"]
    assert params.total_tokens == SEQ
    # Mamba layers reset their state where this document index changes (mamba_mixer.py:750).
    assert params.seq_idx.tolist() == [[0] * 7 + [1] * 12 + [2] * 9 + [3] * 4]
    plugin.run_start(RunStart(get_recipe("tiny_dp1"), Path("."), 0, 1))
    assert plugin.forward_kwargs(row, {})["packed_seq_params"].seq_idx is None
    # Before a run start says what the model is: the side that is never wrong.
    assert PackingPlugin().forward_kwargs(row, {})["packed_seq_params"].seq_idx is not None


def test_forward_kwargs_refuse_unpacked_batches_in_one_line():
    row = as_tensors(packed_row(_documents(), SEQ, PAD))
    unpacked = {key: value for key, value in row.items()
                if key not in ("cu_seqlens", "max_seqlen", "total_tokens")}
    with pytest.raises(UserError, match="need cu_seqlens/max_seqlen/total_tokens in every "
                       "micro-batch, this one has none: its data source does not pack documents"):
        PackingPlugin().forward_kwargs(unpacked, {})
    two_rows = {**row, "tokens": row["tokens"].expand(2, SEQ)}
    with pytest.raises(UserError, match="need one row per micro-batch, got 2"):
        PackingPlugin().forward_kwargs(two_rows, {})


# Packed batches come from prepared data: the data side of every case is consistent.
PACKED_DATA = ["data.source=blend", "data.blend=conf/data/python_stdlib.yaml",
               "data.documents=packed"]

# (rule, overrides on tiny_dp1 that break only that rule, its whole one-line message)
PACKING_RULE_CASES = [
    ("check_packing_micro_batch", PACKED_DATA,
     "data.documents=packed makes packed rows, which need train.micro_batch_size=1 (one packed "
     "row per micro-batch: THD attention flattens the batch into one stream), got 2; set "
     "train.micro_batch_size=1 and pack more documents into each row"),
    ("check_packing_context_parallel",
     ["train.micro_batch_size=1", "parallel.context=2",
      "cluster.gpus_per_node=2", *PACKED_DATA, "data.documents=inter_document"],
     "data.documents=inter_document does not support parallel.context=2 (Megatron's GPTDataset "
     "rows do not pad each document to a multiple of 2 x CP); set data.documents=packed (pads "
     "each document) or parallel.context=1"),
]


@pytest.mark.parametrize(("rule", "overrides", "message"), PACKING_RULE_CASES,
                         ids=[case[0] for case in PACKING_RULE_CASES])
def test_packing_rules_name_field_value_and_fix(rule, overrides, message):
    cfg = apply_overrides(get_recipe("tiny_dp1"), overrides)
    assert failing_rules(cfg) == [rule]
    with pytest.raises(UserError) as caught:
        validate(cfg)
    assert str(caught.value) == message


def test_packing_rules_pass_when_packing_is_off_or_fits():
    off = apply_overrides(get_recipe("tiny_dp1"), ["parallel.context=2", "cluster.gpus_per_node=2"])
    fits = apply_overrides(get_recipe("tiny_dp1"), ["train.micro_batch_size=1", *PACKED_DATA])
    for cfg in (off, fits):
        assert check_packing_micro_batch(cfg) is None
        assert check_packing_context_parallel(cfg) is None
    validate(fits)


# (overrides on tiny_dp1, whether its micro-batches are packed rows)
PACKING_FOLLOWS_DOCUMENTS = [
    ([], False),  # the recipe's in-memory text, concatenated
    (["data.source=blend", "data.blend=conf/data/python_stdlib.yaml"], False),  # concatenated
    ([*PACKED_DATA, "train.micro_batch_size=1"], True),
    ([*PACKED_DATA, "data.documents=inter_document", "train.micro_batch_size=1"], True),
    (["data.source=synthetic"], False),
]


@pytest.mark.parametrize(("overrides", "packed"), PACKING_FOLLOWS_DOCUMENTS,
                         ids=["stdlib", "blend_concatenate", "packed", "inter_document",
                              "synthetic"])
def test_packing_is_built_exactly_when_data_documents_makes_packed_rows(overrides, packed):
    cfg = apply_overrides(get_recipe("tiny_dp1"), overrides)
    assert failing_rules(cfg) == []
    plugins = build_plugins(cfg)
    assert ("packing" in [p.name for p in plugins]) == packed == cfg.plugins.packing.active(cfg)
    if packed:
        assert [p.name for p in plugins] == ["packing", "logging"]
        assert isinstance(plugins.plugins[0], PackingPlugin)


def test_cpu_runtime_swaps_in_the_packed_attention_and_keeps_the_norm_swap():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from trainer.cpu_runtime.packed_attention import PackedDotProductAttention
    from trainer.cpu_runtime.runtime import SequenceParallelTorchNorm, adapt_cpu_layer_spec

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2,
                               tensor_model_parallel_size=2, sequence_parallel=True)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, pp_rank=0)
    adapted = adapt_cpu_layer_spec(spec, config)  # what CPU ranks build (trainer.model)
    for layer in adapted.layer_specs:
        attention = layer.submodules.self_attention.submodules
        assert attention.core_attention is PackedDotProductAttention
        assert layer.submodules.input_layernorm is SequenceParallelTorchNorm
    assert adapted.layer_norm is SequenceParallelTorchNorm
    # Megatron's shared specs are left as they were.
    assert spec.layer_specs[0].submodules.self_attention.submodules.core_attention is (
        DotProductAttention)
    assert use_packed_attention(spec).layer_specs[0].submodules.self_attention.submodules \
        .core_attention is PackedDotProductAttention


def test_documents_padded_for_context_parallel_keep_their_tokens_and_loss():
    docs = [np.arange(1, 8), np.arange(1, 13), np.arange(1, 10)]  # 7, 12 and 9 tokens
    row = packed_row(docs, 32, pad_id=0, pad_multiple=4)
    assert row["cu_seqlens_padded"].tolist() == [0, 8, 20, 32]  # 8, 12, 12: multiples of 4
    assert row["cu_seqlens"].tolist() == [0, 7, 19, 28]  # each document's own tokens
    assert row["position_ids"][0].tolist() == [*range(8), *range(12), *range(12)]
    assert row["loss_mask"][0].sum() == 6 + 11 + 8
    assert row["tokens"][0, 7] == 0 and row["loss_mask"][0, 6:8].tolist() == [0.0, 0.0]
    assert row["tokens"][0, 20:29].tolist() == list(range(1, 10))
    plain = packed_row(docs, 32, pad_id=0)
    assert "cu_seqlens_padded" not in plain and plain["cu_seqlens"].tolist() == [0, 7, 19, 28, 32]


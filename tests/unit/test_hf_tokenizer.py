"""An exported run carries the tokenizer its prepared data was made with: found through the
blend's manifest (prepare_data's `<output>.tokenizer.json`), loadable by transformers, and
encoding exactly as the tokenizer the data was prepared with."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

from trainer.interop.hf_files import RunTokenizer, run_tokenizer, write_tokenizer
from trainer.interop.token_ids import special_ids


def test_run_tokenizer_is_found_through_the_blend_and_loads_in_transformers(tmp_path) -> None:
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, "def": 2, "f": 3, "return": 4, "x": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "corpus.tokenizer.json"))
    manifest = {"tokenizer": "corpus.tokenizer.json", "eod_token": "<|endoftext|>", "eod_id": 0,
                "vocab_size": 6, "shards": []}
    (tmp_path / "corpus.json").write_text(json.dumps(manifest))
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"train:\n  - {{manifest: {tmp_path / 'corpus.json'}, weight: 1.0}}\n")
    found = run_tokenizer(str(blend))
    assert found == RunTokenizer(tmp_path / "corpus.tokenizer.json", "<|endoftext|>", 0,
                                 tmp_path / "corpus.json")
    out = tmp_path / "hf"
    out.mkdir()
    write_tokenizer(found.file, found.eod_token, out)
    loaded = AutoTokenizer.from_pretrained(out)
    text = "def f x return x unknown"
    assert loaded(text)["input_ids"] == tokenizer.encode(text).ids == [2, 3, 5, 4, 5, 1]
    assert loaded.eos_token_id == loaded.pad_token_id == 0  # what config.json says too
    assert special_ids(0, out) == {"bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0}


def test_special_ids_are_the_tokenizers_own_bos_and_pad_else_eos(tmp_path) -> None:
    """A tokenizer folder that names BOS and PAD tokens gives their ids; the EOS is always the
    run's end-of-document id (what the model learned to end a document with)."""
    vocab = {"<|endoftext|>": 0, "<s>": 1, "<pad>": 2, "x": 3}
    Tokenizer(models.WordLevel(vocab, unk_token="x")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "pad_token": "<pad>", "eos_token": "</s>"}))
    assert special_ids(0, tmp_path) == {"bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 2}
    assert special_ids(7, None) == {"bos_token_id": None, "eos_token_id": 7, "pad_token_id": 7}
    assert run_tokenizer(None) is None and run_tokenizer(str(tmp_path / "absent.yaml")) is None

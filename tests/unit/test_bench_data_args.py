"""`scripts/bench_data.py tokenizer=` that cannot be read (or megatron_lm= that is no file, a
vocab= below a byte-level BPE's, format= without memory=true) is one line before anything is
written or timed, not a traceback at the first timed step; a small max_mb= runs: the corpus is cut
at that size and the scaling runs cut it into as many shards as have a document each.
"""

from __future__ import annotations

import re

import pytest

from plugins.protocol.errors import ConfigError
from trainer.tools.benchmarks.data import bench_tokenizer, check_options, cut, run_bench_data
from trainer.tools.benchmarks.data_scale import shards_for


def test_a_missing_tokenizer_is_one_line_before_the_bench_starts(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer=/nope: no such file; name a "
                                          r"tokenizer.json"):
        run_bench_data({"tokenizer": "/nope"})  # nothing else is read first


def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match=r"cannot be read as a tokenizer"):
        bench_tokenizer(str(tmp_path))  # a folder holding one is read as that file


# Options that cannot work are one line before anything is read, written or timed.
@pytest.mark.parametrize(("options", "said"), [
    ({"format": "gz", "memory": False},
     "format=gz applies only with memory=true (the memory benchmark's corpus files); add "
     "memory=true or drop format="),
    ({"megatron_lm": "/nope"}, "megatron_lm=/nope: no such file; name tools/preprocess_data.py"),
    ({"vocab": 10}, "vocab=10 is below 257, the fewest tokens of a byte-level BPE"),
])
def test_an_option_that_cannot_work_is_one_line_up_front(options, said) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        run_bench_data({"memory": False, "format": "jsonl", **options})


def test_a_vocab_of_257_and_format_with_memory_pass(tmp_path) -> None:
    assert check_options({"vocab": 257, "memory": True, "format": "gz"}) is None


def test_the_corpus_is_cut_at_max_mb_exactly() -> None:
    documents = cut(["ab", " ", "cdé" * 10, "never read"], 5)  # "é" is 2 bytes: cut before it
    assert documents == ["ab", "cd"]
    assert sum(len(d.encode()) for d in cut(["x" * 100] * 50, 2**10)) == 2**10


def test_the_scaling_shards_give_every_shard_a_document(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n' * 3 + '{"text": "' + "b" * 1000 + '"}\n')
    assert shards_for(corpus, 4) == 1  # one long document: the ranges after its start are empty
    corpus.write_text('{"text": "a"}\n' * 40)
    assert shards_for(corpus, 4) == 4
    corpus.write_text('{"text": "' + "b" * 100 + '"}\n' + '{"text": "a"}\n' * 3
                      + '{"text": "' + "b" * 100 + '"}\n')
    assert shards_for(corpus, 4) == 2


def test_a_megatron_lm_script_that_writes_nothing_is_one_line(tmp_path, monkeypatch) -> None:
    """megatron_lm= naming a script that runs yet is not Megatron-LM's preprocess_data.py
    (it writes no lm_text_document files): one line, not a FileNotFoundError traceback."""
    from plugins.protocol.errors import UserError
    from trainer.tools.benchmarks import data_scale

    def ran(command, cwd):  # ours writes its pair; the other script nothing
        if "prepare_data.py" in command[1]:
            for suffix in (".bin", ".idx"):
                (cwd / f"ours_corpus{suffix}").write_bytes(b"x")
        return 0.1

    monkeypatch.setattr(data_scale, "_timed", ran)
    tool = tmp_path / "other.py"
    tool.write_text("")
    with pytest.raises(UserError) as error:
        data_scale._compare(tool, tmp_path / "corpus.jsonl", tmp_path / "tok", tmp_path / "cmp")
    assert str(error.value) == (f"megatron_lm={tool} ran but wrote no lm_text_document.bin, so it "
                                "is not Megatron-LM's tools/preprocess_data.py; name that file of "
                                "a Megatron-LM checkout, or leave megatron_lm unset")


@pytest.mark.parametrize("fmt", ["gz", "zst", "parquet", "jsonl"])
def test_memory_corpus_gives_each_of_two_shards_a_file(tmp_path, fmt) -> None:
    """A streamed file lies wholly in the shard where it starts: with a longer second half
    (an odd count, a longer last document) written first-small, both would start in shard 0
    and prepare_data refuse num_shards=2 (a tiny gz corpus did). The larger comes first."""
    from data_prep import readers
    from data_prep.shards import _train_shards_with_input
    from trainer.tools.benchmarks.data_memory import write_parts

    documents = ["short one"] * 10 + ["a much longer document " * 20] * 11
    folder = write_parts(documents, tmp_path / "corpus", fmt, 1)
    files = sorted(folder.iterdir())
    assert len(files) == 2 and files[0].stat().st_size >= files[1].stat().st_size
    kind = "parquet" if fmt == "parquet" else "json"
    compression = {"gz": ".gz", "zst": ".zst"}.get(fmt)
    inputs = [readers.inspect(f, kind, compression, "text", "line") for f in files]
    assert _train_shards_with_input(inputs, 2) == 2

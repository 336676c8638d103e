"""`scripts/prepare_data.py` and `data_prep.prepare`: local files -> Megatron indexed datasets.

One small corpus (a text file, JSONL with a text field, Parquet written by `datasets`, each with
empty documents) is prepared once in this process with a freshly trained BPE and once by the
script in a subprocess; the datasets must read back through Megatron's `IndexedDataset` to the
tokenizer's encoding of each document plus the EOD id, and the two runs must agree byte for
byte (which also shows BPE training is the same in another process). Bad inputs must each be
one `ConfigError` line and leave nothing behind that looks like a dataset.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from data_prep import prepare as prepare_module
from data_prep.config import PrepareConfig, parse_args, validate
from data_prep.hf_tokenizer import prepare_tokenizer
from data_prep.prepare import prepare
from plugins.protocol.errors import ConfigError
from recipes.config.dataset_files import record
from tests.hang import HANG_S
from tests.plain_user import plain_user_prefix

# Reading a dataset outside a process group makes Megatron warn about the rank; datasets'
# map forks its workers from this multi-threaded test process (as it does everywhere).
pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prepare_data.py"
VOCAB = 300

TEXT_LINES = ["the first line of text", "", "   ", "a second line, with 123 digits",
              "éàü unicode déjà vu", "last line"]
JSONL_ROWS = [{"id": 1, "text": "json document one"}, {"id": 2, "text": ""},
              {"id": 3, "text": None}, {"id": 4, "text": "json document four\nwith two lines"}]
PARQUET_TEXTS = ["parquet row zero", "\n\t", "parquet row two is a little longer than zero"]
EXPECTED = {  # shard name -> the documents it must hold (whitespace is text, as in Megatron-LM)
    "a": [t for t in TEXT_LINES if t],
    "b": ["json document one", "json document four\nwith two lines"],
    "c": PARQUET_TEXTS,
}
ROWS = {"a": len(TEXT_LINES), "b": len(JSONL_ROWS), "c": len(PARQUET_TEXTS)}
EMPTY = {"a": 1, "b": 2, "c": 0}  # written as zero-length documents
MEGATRON_LM_FILES = ("corpus.data-args", "corpus.per-split-data-args.json")  # absolute paths


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("\n".join(TEXT_LINES) + "\n", encoding="utf-8")
    (folder / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in JSONL_ROWS))
    datasets.Dataset.from_dict({"text": PARQUET_TEXTS, "n": [0, 1, 2]}).to_parquet(
        str(folder / "c.parquet"))
    return folder


def dataset_like(folder: Path) -> list[str]:
    """Files a reader could mistake for output, and leftover work folders."""
    return sorted(p.name for p in folder.iterdir()
                  if p.suffix in (".bin", ".idx", ".json") or p.name.endswith((".tmp", ".work")))


def read_back(prefix: Path) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(str(prefix))
    return [data[i].tolist() for i in range(len(data))]


def document_entries(prefix: Path) -> int:
    """Documents in the index, zero-length ones included (what Megatron-LM counts)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return len(IndexedDataset(str(prefix)).document_indices) - 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def script_run(corpus: Path, tmp_path_factory):
    """The script on the same corpus in a subprocess, started first so that its imports
    (Megatron's take seconds) overlap the in-process run."""
    out = tmp_path_factory.mktemp("script") / "corpus"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), f"input={corpus}", f"output={out}",
         f"tokenizer=train:{VOCAB}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO)
    yield out, process
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def first(corpus: Path, script_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("first") / "corpus"
    return prepare(PrepareConfig(input=str(corpus), output=str(out), tokenizer=f"train:{VOCAB}"))


def test_datasets_read_back_to_the_tokenizers_encoding(first) -> None:
    tokenizer = Tokenizer.from_file(str(first.tokenizer_file))
    eod = first.tokenizer.eod_id
    assert tokenizer.id_to_token(eod) == "<|endoftext|>" and first.dtype == "uint16"
    assert tokenizer.get_vocab_size() <= VOCAB
    for name, documents in EXPECTED.items():
        expected = [tokenizer.encode(text).ids + [eod] for text in documents]
        assert read_back(first.output.with_name(f"corpus_{name}")) == expected
        assert document_entries(first.output.with_name(f"corpus_{name}")) == ROWS[name]


def test_one_shard_per_input_with_counts_and_manifest(first) -> None:
    assert [s.prefix for s in first.shards] == ["corpus_a", "corpus_b", "corpus_c"]
    for shard, name in zip(first.shards, "abc", strict=True):
        assert shard.documents == len(EXPECTED[name])
        assert shard.empty == EMPTY[name]
    saved = json.loads(first.manifest.read_text())
    assert saved["shards"][1] == {"prefix": "corpus_b", "source": saved["shards"][1]["source"],
                                  "documents": 2, "empty": 2,
                                  "tokens": first.shards[1].tokens,
                                  **record(str(first.output.parent / "corpus_b"))}
    assert saved["blend"] == [first.shards[0].tokens, "corpus_a", first.shards[1].tokens,
                              "corpus_b", first.shards[2].tokens, "corpus_c"]
    assert saved["empty"] == 3 and saved["tokens"] == first.tokens
    assert saved["valid_shards"] == saved["test_shards"] == []
    assert dataset_like(first.output.parent) == [
        "corpus.json", "corpus.per-split-data-args.json", "corpus_a.bin", "corpus_a.idx",
        "corpus_b.bin", "corpus_b.idx", "corpus_c.bin", "corpus_c.idx"]


def test_script_end_to_end_gives_byte_identical_outputs(first, script_run) -> None:
    """A second run, in another process (BPE trained again there), writes the same bytes."""
    out, process = script_run
    stdout, stderr = process.communicate(timeout=HANG_S)
    assert process.returncode == 0, stderr
    assert "prepared 10 documents (3 empty, zero-length)" in stdout
    assert "tokens/s" in stdout and "3 shard(s)" in stdout
    names = dataset_like(first.output.parent)
    assert dataset_like(out.parent) == names
    tokenizer = ["corpus.tokenizer/tokenizer.json", "corpus.tokenizer/tokenizer_config.json"]
    for name in [n for n in [*names, *tokenizer] if n not in MEGATRON_LM_FILES]:
        assert (out.parent / name).read_bytes() == (first.output.parent / name).read_bytes(), name


def test_saved_tokenizer_many_processes_and_shard_size(first, corpus: Path, tmp_path) -> None:
    """The saved tokenizer (given as a folder) with num_proc=2 writes the same datasets;
    shard_size splits an input into numbered datasets."""
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(first.tokenizer_file.read_bytes())
    again = prepare(PrepareConfig(input=f"{corpus}/*.jsonl,{corpus}/a.txt",
                                  output=str(tmp_path / "corpus"), tokenizer=str(folder),
                                  num_proc=2))
    assert [s.prefix for s in again.shards] == ["corpus_b", "corpus_a"]
    for name in ("corpus_a.bin", "corpus_a.idx", "corpus_b.bin", "corpus_b.idx"):
        assert (tmp_path / name).read_bytes() == (first.output.parent / name).read_bytes()
    split = prepare(PrepareConfig(input=f"{corpus}/a.txt", output=str(tmp_path / "s"),
                                  tokenizer=str(first.tokenizer_file), shard_size=2))
    assert [(s.prefix, s.documents) for s in split.shards] == [
        ("s_a_00000", 2), ("s_a_00001", 2), ("s_a_00002", 1)]
    assert sum(s.empty for s in split.shards) == EMPTY["a"]
    parts = [read_back(tmp_path / f"s_a_0000{i}") for i in range(3)]
    assert sum(parts, []) == read_back(first.output.with_name("corpus_a"))


def test_empty_documents_skip_leaves_them_out_of_the_index(first, corpus: Path,
                                                           tmp_path) -> None:
    result = prepare(PrepareConfig(input=str(corpus), output=str(tmp_path / "corpus"),
                                   tokenizer=str(first.tokenizer_file), empty_documents="skip"))
    assert [(s.documents, s.empty) for s in result.shards] == [(4, 2), (2, 2), (2, 1)]
    assert (tmp_path / "corpus_a.bin").read_bytes() != (first.output.parent /
                                                         "corpus_a.bin").read_bytes()
    assert (tmp_path / "corpus_b.bin").read_bytes() == (first.output.parent /
                                                         "corpus_b.bin").read_bytes()
    assert document_entries(tmp_path / "corpus_b") == 2


def test_missing_eod_is_added_as_a_special_token(tmp_path, corpus: Path) -> None:
    words = {w: i for i, w in enumerate(["[UNK]", "the", "first", "line", "of", "text"])}
    plain = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    plain.save(str(tmp_path / "plain.json"))
    result = prepare(PrepareConfig(input=f"{corpus}/a.txt", output=str(tmp_path / "w"),
                                   tokenizer=str(tmp_path / "plain.json")))
    assert (result.tokenizer.eod_id, result.tokenizer.eod_added) == (6, True)
    assert read_back(tmp_path / "w_a")[0] == [1, 2, 3, 4, 5, 6]
    saved = Tokenizer.from_file(str(result.tokenizer_file))
    assert saved.token_to_id("<|endoftext|>") == 6


def test_eod_of_a_tokenizer_folder_comes_from_its_config(tmp_path) -> None:
    words = {"[UNK]": 0, "<|endoftext|>": 1, "</s>": 2, "word": 3}
    folder = tmp_path / "hf"
    folder.mkdir()
    Tokenizer(models.WordLevel(words, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    cfg = PrepareConfig(input="x", output="y", tokenizer=str(folder))
    assert prepare_tokenizer(cfg).eod_id == 2
    (folder / "tokenizer_config.json").unlink()
    assert prepare_tokenizer(cfg).eod_id == 1  # the first known end-of-text token


def test_outputs_inside_the_input_folder_are_not_read_back(first, corpus: Path,
                                                            tmp_path) -> None:
    folder = tmp_path / "data"
    shutil.copytree(corpus, folder)
    cfg = PrepareConfig(input=str(folder), output=str(folder / "out"),
                        tokenizer=str(first.tokenizer_file))
    assert [s.prefix for s in prepare(cfg).shards] == ["out_a", "out_b", "out_c"]
    assert [s.prefix for s in prepare(cfg).shards] == ["out_a", "out_b", "out_c"]
    with pytest.raises(ConfigError, match="out.json is a file this run writes"):
        validate(PrepareConfig(input=f"{folder}/a.txt,{folder}/out.json",
                               output=str(folder / "out"), tokenizer="train:300"))


def bad_files(root: Path) -> dict[str, Path]:
    """Inputs that must be refused, written once."""
    root.mkdir(exist_ok=True)
    files = {"empty": root / "empty.jsonl", "blank": root / "blank.txt",
             "fields": root / "fields.jsonl", "number": root / "number.jsonl",
             "broken": root / "broken.jsonl", "garbage_tok": root / "garbage.json",
             "a_file": root / "a_file", "odd": root / "notes.csv", "nojson": root / "tokdir"}
    files["empty"].write_text("")
    files["blank"].write_text("\n   \n\n")
    files["fields"].write_text('{"content": "x", "id": 1}\n')
    files["number"].write_text('{"text": 5, "body": "x"}\n')
    files["broken"].write_text('{"text": "ok"}\n{"text": \n')
    files["garbage_tok"].write_text("{not json")
    files["a_file"].write_text("x")
    files["odd"].write_text("a,b\n")
    files["nojson"].mkdir(exist_ok=True)
    (files["nojson"] / "vocab.json").write_text("{}")
    return files


# (arguments on top of a good input/output/tokenizer, text the one line must contain)
BAD = [
    ({"input": "{root}/nothing*.jsonl"}, "matches no files"),
    ({"input": "{root}/missing.jsonl"}, "input={root}/missing.jsonl does not exist"),
    ({"input": "{root}/empty.jsonl"}, "is empty (0 bytes); remove it from input="),
    ({"input": "{root}/notes.csv"}, "has an unknown format ('.csv')"),
    ({"input": "{root}/blank.txt"}, "has no text: all 3 lines are empty"),
    ({"input": "{root}/fields.jsonl"}, "has no field 'text'; its fields are content, id; "
     "set text_field=content"),
    ({"input": "{root}/number.jsonl"}, "field 'text' holds int64, not text; set text_field to "
     "a text field (text fields: body)"),
    ({"input": "{root}/broken.jsonl"}, "cannot be read as JSON lines"),
    ({"tokenizer": "{root}/none.json"}, "tokenizer={root}/none.json does not exist; give a "
     "tokenizer.json file"),
    ({"tokenizer": "{root}/tokdir"}, "is a folder without tokenizer.json (it holds vocab.json)"),
    ({"tokenizer": "{root}/garbage.json"}, "cannot be loaded as a Hugging Face tokenizers file"),
    ({"tokenizer": "train:100"}, "a byte-level BPE needs 257 to"),
    ({"tokenizer": "train:big"}, "VOCAB must be a whole number"),
    ({"output": "{root}/a_file/corpus"}, "its folder cannot be created because {root}/a_file is "
     "a file"),
    ({"output": "{root}"}, "output={root} is a folder; give a file prefix inside it"),
    ({"num_proc": 0}, "num_proc=0 must be at least 1"),
    ({"pad_multiple": 0}, "pad_multiple=0 must be at least 1 (1: no padding; for context "
     "parallel 2 x CP, e.g. packing.pad_multiple=4 for CP2)"),
    ({"pad_multiple": 4}, "pad_multiple=4 pads documents in a packing index, but none is "
     "written; also give packing.seq_length=<row length>, or leave pad_multiple unset"),
    ({"eod_token": "<nope>"}, "eod_token=<nope> is not a token of tokenizer="),
    ({"num_shards": 0}, "num_shards=0 must be at least 1, e.g. num_shards=128"),
    ({"valid_shards": -1}, "valid_shards=-1 must be at least 0, e.g. valid_shards=1"),
    ({"num_shards": 4, "shard_size": 10}, "shard_size=10 and num_shards=4 both cut the "
     "datasets; give one of them"),
    ({"held_out_fraction": 0.5}, "held_out_fraction=0.5 must be in (0, 1/3]"),
    ({"ray_address": "ray://head:10001"}, "ray_address=ray://head:10001 is used by "
     "executor=ray only"),
    ({"executor": "ray", "ray_address": "garbage"}, "ray_address=garbage is not a Ray address; "
     "give ray://HOST:PORT (Ray Client, e.g. ray://head:10001), HOST:PORT"),
    ({"executor": "ray", "ray_address": "head:99999"}, "ray_address=head:99999 is not a Ray "
     "address"),
]


@pytest.mark.parametrize(("changes", "expected"), BAD, ids=[e[:30] for _, e in BAD])
def test_bad_input_is_one_line_and_leaves_no_dataset(changes, expected, corpus, first,
                                                     tmp_path_factory) -> None:
    root = tmp_path_factory.getbasetemp() / "bad"
    if not root.exists():
        bad_files(root)
    out = tmp_path_factory.mktemp("out")
    args = {"input": str(corpus / "b.jsonl"), "output": str(out / "corpus"),
            "tokenizer": str(first.tokenizer_file)}
    args.update({k: v.format(root=root) if isinstance(v, str) else v for k, v in changes.items()})
    with pytest.raises(ConfigError) as error:
        prepare(PrepareConfig(**args))
    message = str(error.value)
    assert expected.format(root=root) in message and "\n" not in message, message
    assert dataset_like(out) == []


@pytest.mark.parametrize(("argv", "expected"), [
    (["inptu=a.txt"], "unknown key 'inptu'; did you mean input?"),
    (["json_keys=text"], "unknown key 'json_keys'; did you mean text_field?"),
    (["input=a", "output=b", "tokenizer=c", "num_proc=two"],
     "num_proc expects an integer, got 'two'; e.g. num_proc=4"),
    (["input=a", "output=", "tokenizer=c"], "output is empty; give it a value, e.g. "
     "output=data/corpus"),
    (["input=a", "sample_by=page", "output=b", "tokenizer=c"],
     "sample_by expects one of line, paragraph, document, got 'page'"),
    (["input=a"], "missing output, tokenizer; give output=data/corpus, tokenizer=train:32000"),
    (["input", "a.txt"], "'input' is not an argument; write KEY=VALUE"),
    (["--input=a"], "'--input=a' is not an argument; write KEY=VALUE without dashes"),
    (["input=a", "output=data/", "tokenizer=c"], "output=data/ is a folder, not a file prefix"),
    (["input=a", "output=b", "tokenizer=c", "packing.seq_length=30", "packing.pad_multiple=4"],
     "packing.seq_length=30 is not a multiple of packing.pad_multiple=4 (context parallel cuts "
     "every row into 2 x CP chunks); give e.g. packing.seq_length=28"),
])
def test_command_line_mistakes_are_one_line(argv, expected) -> None:
    with pytest.raises(ConfigError) as error:
        validate(parse_args(argv))
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_script_bad_input_exits_2_with_one_line(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), f"input={tmp_path}/*.jsonl", f"output={tmp_path}/c",
         "tokenizer=train:1000"], capture_output=True, text=True, timeout=HANG_S, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr == f"error: input={tmp_path}/*.jsonl matches no files; check the " \
        "pattern or the folder\n"
    assert done.stdout == ""


@pytest.mark.parametrize("multiple", [1, 4])
def test_packing_index_beside_every_dataset_holds_every_document(corpus: Path, tmp_path,
                                                                 multiple: int) -> None:
    """packing.seq_length=N also writes an exact packing index per dataset, before the
    manifest; its pieces rebuild every document and no pack overflows, with each piece padded
    to a multiple of packing.pad_multiple (the index a CP2 run reads)."""
    from data_prep.packing import PackIndex, pack_index_paths

    out = tmp_path / "packed"
    result = prepare(parse_args([f"input={corpus}", f"output={out}", f"tokenizer=train:{VOCAB}",
                                 "packing.seq_length=16", f"packing.pad_multiple={multiple}"]))
    assert result.pack_size == 16 and len(result.packs) == len(result.shards)
    assert result.pad_multiple == multiple
    assert "packs of 16 tokens" in prepare_module.summary_line(result)
    padded_text = "each document padded to a multiple of 4"
    assert (padded_text in prepare_module.summary_line(result)) == (multiple > 1)
    for shard in result.shards:
        prefix = out.parent / shard.prefix
        assert pack_index_paths(prefix, 16, multiple)[2].name == (
            f"{shard.prefix}.pack16.json" if multiple == 1 else f"{shard.prefix}.pack16.pad4.json")
        documents = read_back(prefix)
        index = PackIndex(prefix, 16, multiple)
        rebuilt: dict[int, list[int]] = {}
        for i in range(len(index)):
            ids, starts, lengths = index.pack(i)
            assert int((-(-lengths // multiple) * multiple).sum()) <= 16
            for d, s, n in zip(ids, starts, lengths, strict=True):
                rebuilt.setdefault(int(d), []).append((int(s), documents[int(d)][s:s + n]))
        assert {d: [t for _, piece in sorted(p) for t in piece] for d, p in rebuilt.items()} == {
            d: doc for d, doc in enumerate(documents)}


def test_the_tokenizer_folder_loads_in_transformers_and_megatron(first) -> None:
    """The saved folder names its EOS: `transformers.AutoTokenizer` and Megatron's
    HuggingFaceTokenizer (what Megatron-LM's preprocess_data and training build from
    --tokenizer-model) both load it, with the EOD the datasets were written with."""
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
        HuggingFaceTokenizer,
    )
    from transformers import AutoTokenizer

    folder = first.tokenizer_dir
    eod = first.tokenizer.eod_id
    loaded = AutoTokenizer.from_pretrained(str(folder))
    assert (loaded.eos_token, loaded.eos_token_id) == ("<|endoftext|>", eod)
    megatron = HuggingFaceTokenizer(str(folder))
    assert megatron.eod == eod
    text = EXPECTED["a"][0]
    assert megatron.text_to_ids(text) == Tokenizer.from_file(str(first.tokenizer_file)).encode(
        text).ids


def test_datasets_equal_megatron_lms_byte_for_byte(first, tmp_path) -> None:
    """Megatron-LM's tools/preprocess_data.py (--append-eod, one JSON key) writes, for each
    line, its tokenizer's ids plus the EOD, or nothing for an empty document, through the
    same builder; done here with Megatron's own tokenizer class on the saved folder, the
    .bin and .idx must be the same bytes. (scripts/bench_data.py runs the real tool.)"""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
        HuggingFaceTokenizer,
    )

    texts = ["first document", "", "   ", "a second\nline", "", "last one, déjà vu"]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ours = prepare(PrepareConfig(input=str(source), output=str(tmp_path / "ours"),
                                 tokenizer=str(first.tokenizer_dir)))
    tokenizer = HuggingFaceTokenizer(str(first.tokenizer_dir))
    builder = IndexedDatasetBuilder(str(tmp_path / "lm_text_document.bin"),
                                    dtype=np.dtype(ours.dtype).type)
    for text in texts:
        ids = tokenizer.text_to_ids(text)
        ids = [*ids, tokenizer.eod] if ids else []
        builder.add_document(np.asarray(ids, dtype=ours.dtype), [len(ids)] if ids else [])
    builder.finalize(str(tmp_path / "lm_text_document.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours_docs{suffix}").read_bytes() == (
            tmp_path / f"lm_text_document{suffix}").read_bytes()
    assert document_entries(tmp_path / "ours_docs") == len(texts)


def test_the_manifest_gives_megatron_lms_blend_arguments(first) -> None:
    folder = first.output.parent.resolve()
    expected = [first.shards[0].tokens, str(folder / "corpus_a"), first.shards[1].tokens,
                str(folder / "corpus_b"), first.shards[2].tokens, str(folder / "corpus_c")]
    assert first.data_args.read_text().split() == [str(x) for x in expected]
    assert json.loads(first.per_split_args.read_text()) == {"train": expected}
    saved = json.loads(first.manifest.read_text())
    assert saved["megatron"] == {"data_args_path": "corpus.data-args",
                                 "per_split_data_args_path": "corpus.per-split-data-args.json"}
    line = prepare_module.summary_line(first)
    assert f"--data-args-path {first.data_args} --tokenizer-type HuggingFaceTokenizer" in line


def test_the_comparison_with_megatron_lm_needs_work_above_start_up():
    from trainer.tools.benchmarks.data_scale import work_share_problem

    assert work_share_problem({"prepare_data": 0.45, "Megatron-LM": 0.7}) is None
    problem = work_share_problem({"prepare_data": 0.05, "Megatron-LM": 0.5})
    assert problem.startswith("the corpus is too small to time against start-up")
    assert "prepare_data 5%" in problem and "Megatron-LM 50%" not in problem


def test_an_input_folder_lists_visible_files_and_refuses_a_closed_subfolder(tmp_path) -> None:
    """Hidden files and folders are passed over; a subfolder this user may not read would be
    passed over too (Path.rglob says nothing) and its files left out: refused instead (as
    root with the capabilities that read through chmod dropped)."""
    from data_prep.config import resolve_inputs

    corpus = tmp_path / "corpus"
    for name in ("a.jsonl", "sub/b.jsonl", ".hidden/c.jsonl", "sub/.d.jsonl"):
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text('{"text": "hello"}\n')
    assert resolve_inputs(str(corpus)) == [corpus / "a.jsonl", corpus / "sub" / "b.jsonl"]
    (corpus / "sub").chmod(0)
    code = ("import sys\nfrom data_prep.config import resolve_inputs\n"
            "from plugins.protocol.errors import ConfigError\n"
            "try:\n    resolve_inputs(sys.argv[1])\n"
            "except ConfigError as error:\n    print(error)\n")
    try:
        done = subprocess.run([*plain_user_prefix(), sys.executable, "-c", code, str(corpus)],
                              cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    finally:
        (corpus / "sub").chmod(0o755)
    assert done.stdout == (f"input={corpus}: the folder {corpus / 'sub'} is closed to this user "
                           "(Permission denied), so its files would be left out; open it to "
                           "this user, or give another input\n"), done.stderr[-3000:]


def test_an_option_for_another_kind_of_input_is_refused_not_ignored(tmp_path) -> None:
    text, records = tmp_path / "a.txt", tmp_path / "b.jsonl"
    text.write_text("hello\n")
    records.write_text('{"text": "hello"}\n')

    def refusal(*words: str) -> str | None:
        cfg = parse_args([*words, f"output={tmp_path / 'out' / 'x'}", "tokenizer=train:300"])
        try:
            validate(cfg)
        except ConfigError as error:
            return str(error)
        return None

    assert refusal(f"input={text}", "text_field=body") == (
        "text_field=body names a field of JSONL or Parquet records, but every input is a text "
        "file (its lines or paragraphs are the text): drop text_field=")
    assert refusal(f"input={records}", "sample_by=paragraph") == (
        "sample_by=paragraph splits text files into documents, but every input is JSONL or "
        "Parquet (a record is a document): drop sample_by=")
    assert refusal(f"input={text},{records}", "text_field=text", "sample_by=paragraph") is None
    assert refusal(f"input={text}") is None and refusal(f"input={records}") is None

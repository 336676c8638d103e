"""Blend files: read and checked before any rank starts, every mistake one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.blend import load_blend, manifest_dataset, manifest_split
from recipes.config.overrides import apply_overrides
from recipes.config.path_rules import check_data_blend
from recipes.registry import get_recipe
from tests.unit.dataset_fixtures import write_dataset

REPO = Path(__file__).resolve().parents[2]


def _dataset(folder: Path, name: str) -> str:
    """A small real indexed dataset (Megatron Core's writer; the blend checks read its index)."""
    return write_dataset(folder / name, [[1, 2, 0], [3, 0]])


def _manifest(folder: Path, shards: dict[str, int], eod: int = 0, vocab: int = 512) -> str:
    for name in shards:
        _dataset(folder, name)
    path = folder / "prep.json"
    path.write_text(json.dumps({"eod_id": eod, "vocab_size": vocab, "shards": [
        {"prefix": name, "tokens": tokens} for name, tokens in shards.items()]}))
    return str(path)


def _blend(folder: Path, text: str) -> str:
    path = folder / "blend.yaml"
    path.write_text(text)
    return str(path)


def test_a_manifest_is_one_source_of_its_shards_in_order(tmp_path):
    """Its shards reach Megatron as one dataset (the unsharded one), with the entry's weight."""
    manifest = _manifest(tmp_path, {"a": 300, "b": 100})
    other = _dataset(tmp_path, "c")
    blend = load_blend(_blend(tmp_path, f"train:\n  - {{manifest: {manifest}, weight: 0.8}}\n"
                                        f"  - {{prefix: {other}, weight: 0.2}}\n"))
    prefixes, weights = blend.weights(blend.train)
    assert prefixes == [manifest_dataset(manifest, "train"), other]
    assert weights == pytest.approx([0.8, 0.2])
    assert [Path(p).name for p in blend.train[0].prefixes] == ["a", "b"]
    assert blend.train[1].prefixes == (other,)
    assert [Path(s.label).name for s in blend.train] == ["prep", "c"]
    assert (blend.eod_id, blend.vocab_size, blend.split, blend.valid) == (0, 512, (95.0, 5.0), None)


def test_a_manifest_dataset_path_names_its_manifest_and_split():
    assert manifest_split(manifest_dataset("d/web.json", "valid")) == ("d/web.json", "valid")
    assert manifest_split(manifest_dataset("d/web.json", "train")) == ("d/web.json", "train")
    assert manifest_split("/data/web/web_train_00003") is None
    assert manifest_split("/data/odd#name") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train:\n  - {prefix: {missing}, weight: 1}\neod_id: 0\nvocab_size: 9\n",
         "has no {missing}.bin or {missing}.idx; prepare it with scripts/prepare_data.py"),
        ("train:\n  - {prefix: {ok}, weight: -1}\neod_id: 0\nvocab_size: 9\n",
         "weight -1 of"),
        ("train:\n  - {prefix: {ok}, weight: 0}\neod_id: 0\nvocab_size: 9\n",
         "all weights are zero; give at least one source a positive weight"),
        ("train:\n  - {prefix: {ok}, weight: .nan}\neod_id: 0\nvocab_size: 9\n",
         "must be a finite number >= 0"),
        ("train:\n  - {prefix: {ok}}\n", "needs eod_id and vocab_size"),
        ("train: []\n", "must be non-empty lists"),
        ("valid: []\n", "needs a 'train' list"),
        ("train:\n  - {prefix: {ok}, manifest: x.json}\n", "needs exactly one of"),
        ("train:\n  - {manifest: nowhere.json}\n", "manifest nowhere.json is missing"),
        ("train:\n  - {prefix: {ok}}\neod_id: 0\nvocab_size: 9\nsplit: [100, 0]\n",
         "split [100, 0] must be [train, held-out] shares"),
        ("train: [\n", "is not valid YAML"),
    ],
)
def test_blend_mistakes_are_one_line(tmp_path, text, message):
    ok, missing = _dataset(tmp_path, "ok"), str(tmp_path / "missing")
    path = _blend(tmp_path, text.replace("{ok}", ok).replace("{missing}", missing))
    with pytest.raises(ConfigError) as caught:
        load_blend(path)
    assert message.replace("{missing}", missing) in str(caught.value)
    assert str(caught.value).startswith(f"data.blend={path}") and "\n" not in str(caught.value)


def test_manifests_must_agree_on_the_tokenizer(tmp_path):
    (tmp_path / "x").mkdir()
    first = _manifest(tmp_path, {"a": 1}, eod=0)
    second = _manifest(tmp_path / "x", {"b": 1}, eod=5)
    with pytest.raises(ConfigError, match=r"manifests disagree on \(eod_id, vocab_size\)"):
        load_blend(_blend(tmp_path, f"train:\n  - {{manifest: {first}}}\n"
                                    f"  - {{manifest: {second}}}\n"))


def test_the_run_checks_the_blend_and_its_vocabulary_before_launch(tmp_path):
    manifest = _manifest(tmp_path, {"a": 10}, vocab=300)
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n")
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", f"data.blend={path}"])
    assert check_data_blend(cfg) == (
        f"data.blend={path} holds token ids up to 299, but model.vocab_size=256; set "
        "model.vocab_size=300 (its tokenizer has 300 ids), or prepare the data with a tokenizer "
        "of at most 256 ids")
    cfg.model.vocab_size = 300
    assert check_data_blend(cfg) is None
    cfg.data.blend = str(tmp_path / "none.yaml")
    assert "does not exist; name a blend file" in check_data_blend(cfg)


def test_packed_documents_take_a_weighted_blend(tmp_path):
    """Packed rows follow the blend's weights (`trainer/pack_order.py`), as Nemotron 3 Nano's
    long-context phase sets its mix of long and short documents by them: no refusal."""
    first, second = _dataset(tmp_path, "a"), _dataset(tmp_path, "b")
    path = _blend(tmp_path, f"train:\n  - {{prefix: {first}, weight: 0.7}}\n"
                            f"  - {{prefix: {second}, weight: 0.3}}\neod_id: 0\nvocab_size: 256\n")
    cfg = apply_overrides(get_recipe("tiny_dp1"), [
        "data.source=blend", f"data.blend={path}", "data.documents=packed",
        "train.micro_batch_size=1"])
    assert check_data_blend(cfg) is None


def test_the_nemotron_style_example_is_a_well_formed_blend():
    """Its sources live on a cluster; here only their absence may be reported."""
    with pytest.raises(ConfigError, match="manifest /data/prepared/web_crawl_high"):
        load_blend(str(REPO / "conf" / "data" / "nemotron_style_example.yaml"))


@pytest.mark.parametrize("split", [(95.0, 5.0), (98.0, 1.0), (90.0, 10.0), (5.0, 95.0),
                                   (99.0, 1.0), (2.0, 1.0)])
def test_split_documents_are_megatrons_own_bookends(split):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    from recipes.config.blend import split_documents

    matrix = convert_split_vector_to_split_matrix(
        parse_and_normalize_split(f"{split[0]:g},{split[1]:g},0"))
    for documents in range(0, 60):
        counts = [int(round(hi * float(documents))) - int(round(lo * float(documents)))
                  for lo, hi in matrix[:2]]  # blended_megatron_dataset_builder.py:470-471
        assert split_documents(documents, split) == tuple(counts), (documents, split)


def test_a_source_too_small_for_its_heldout_share_is_refused_alone(tmp_path):
    """Five documents at 95/5 give the held-out split none (round(0.95 x 5) = 5): refused
    before launch, by this rule only; twenty give it one."""
    from recipes.config.path_rules import PATH_RULES, check_blend_splits

    def run(documents: int):
        prefix = write_dataset(tmp_path / f"d{documents}", [[1, 2, 0]] * documents)
        blend = tmp_path / f"blend{documents}.yaml"
        blend.write_text(f"train: [{{prefix: {prefix}}}]\nsplit: [95, 5]\neod_id: 0\n"
                         "vocab_size: 256\n")
        return apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend",
                                                        f"data.blend={blend}"])

    small = run(5)
    assert [rule.__name__ for rule in PATH_RULES if rule(small)] == ["check_blend_splits"]
    message = check_blend_splits(small)
    assert message == (
        f"data.blend={tmp_path / 'blend5.yaml'}: source {tmp_path / 'd5'} has 5 documents, too "
        "few for its held-out share (split 95/5 gives it 0; Megatron's dataset builder would "
        "wait forever); raise the held-out share above 5, give the blend valid: sources, or "
        "prepare more documents")
    assert check_blend_splits(run(20)) is None
    phased = apply_overrides(run(20), [f"phases=[{{name: a, end_step: 100}}, {{name: b, "
                                       f"end_step: 300, blend: {tmp_path / 'blend5.yaml'}}}]"])
    assert check_blend_splits(phased) == message  # a phase's blend is checked too


def test_a_manifests_split_counts_the_documents_of_all_its_shards(tmp_path):
    """Its shards are one dataset: at 75/25 two shards of two documents each give the held-out
    split one of four (each alone would give it none); at 95/5 the four give it none."""
    from recipes.config.blend import empty_split_problem

    manifest = _manifest(tmp_path, {"a": 5, "b": 5})  # two documents per shard

    def problem(split: str) -> str | None:
        return empty_split_problem(load_blend(_blend(
            tmp_path, f"train:\n  - {{manifest: {manifest}}}\nsplit: [{split}]\n")))

    assert problem("75, 25") is None
    assert problem("95, 5") == (
        f"data.blend={tmp_path / 'blend.yaml'}: source {manifest} has 4 documents, too few for "
        "its held-out share (split 95/5 gives it 0; Megatron's dataset builder would wait "
        "forever); raise the held-out share above 5, give the blend valid: sources, or "
        "prepare more documents")


def _tokenizer(folder: Path, words: list[str]) -> Path:
    """A tokenizer folder (tokenizer.json) of these words, as prepare_data writes one."""
    from tokenizers import Tokenizer, models

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|endoftext|>": 0, **{word: i + 1 for i, word in enumerate(words)}}
    Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>")).save(
        str(folder / "tokenizer.json"))
    return folder


def _named(folder: Path, tokenizer: Path) -> str:
    """A manifest in `folder` naming `tokenizer` (relative to it, as prepare_data writes)."""
    manifest = _manifest(folder, {"a": 5})
    facts = json.loads(Path(manifest).read_text())
    facts["tokenizer"] = str(Path(tokenizer).relative_to(folder, walk_up=True))
    Path(manifest).write_text(json.dumps(facts))
    return manifest


def test_a_blends_manifests_share_one_tokenizer_or_are_refused_naming_both(tmp_path):
    """Same tokenizer.json bytes in two folders: one tokenizer. Other bytes with the same
    vocabulary size: refused in one line naming both (comparing eod_id and vocab_size alone
    let them through)."""
    first = _tokenizer(tmp_path / "one" / "web.tokenizer", ["a", "b"])
    copy = _tokenizer(tmp_path / "two" / "code.tokenizer", ["a", "b"])
    other = _tokenizer(tmp_path / "three" / "books.tokenizer", ["b", "a"])
    web = _named(tmp_path / "one", first)
    code = _named(tmp_path / "two", copy)
    books = _named(tmp_path / "three", other)
    same = load_blend(_blend(tmp_path, f"train: [{{manifest: {web}}}, {{manifest: {code}}}]\n"))
    assert same.tokenizer == str(first)
    path = _blend(tmp_path, f"train: [{{manifest: {web}}}, {{manifest: {books}}}]\n")
    with pytest.raises(ConfigError) as refused:
        load_blend(path)
    assert str(refused.value) == (
        f"data.blend={path}: manifest {web} was prepared with tokenizer {first} and manifest "
        f"{books} with tokenizer {other}, which differ (their tokenizer.json are not the same); "
        f"blend datasets prepared with one tokenizer: prepare the others again with "
        f"tokenizer={first}")


def test_tokenizer_problem_fires_alone_and_passes_what_it_cannot_read(tmp_path):
    from recipes.config.blend import tokenizer_problem

    a = _tokenizer(tmp_path / "a", ["x"])
    b = _tokenizer(tmp_path / "b", ["y"])
    assert tokenizer_problem("b.yaml", [("m1", a), ("m2", a)]) is None
    assert tokenizer_problem("b.yaml", [("m1", a), ("m2", tmp_path / "gone")]) is None
    assert tokenizer_problem("b.yaml", [("m1", a), ("m2", b)]).startswith(
        f"data.blend=b.yaml: m1 was prepared with tokenizer {a} and m2 with tokenizer {b}")


def test_a_model_vocabulary_much_larger_than_the_tokenizers_is_warned_alone(tmp_path):
    from recipes.config.path_rules import vocabulary_much_larger, vocabulary_too_small

    manifest = _manifest(tmp_path, {"a": 10}, vocab=2048)
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n")
    blend = load_blend(path)
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", f"data.blend={path}",
                                                   "model.vocab_size=128256"])
    assert vocabulary_much_larger(cfg, blend) == (
        f"model.vocab_size=128256 is 62.6x the 2048 ids of data.blend={path}'s tokenizer: "
        "126208 embedding and output rows never see a token and the output layer computes "
        "them every step; set model.vocab_size=2048 (Megatron pads it for TP), or prepare the "
        "data with the model's own tokenizer")
    assert vocabulary_too_small(cfg, blend) is None
    for fits in (2048, 4095):  # the tokenizer's own size, and under twice it: no word
        cfg.model.vocab_size = fits
        assert vocabulary_much_larger(cfg, blend) is None and vocabulary_too_small(
            cfg, blend) is None


def test_a_manifest_edited_to_a_smaller_vocabulary_is_refused_not_advised(tmp_path):
    """Before, a manifest whose vocab_size was edited to 3 (its data holds id 3) passed, and
    the run's vocabulary warning then advised model.vocab_size=3."""
    manifest = _manifest(tmp_path, {"a": 5, "b": 5}, vocab=3)
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n")
    with pytest.raises(ConfigError) as error:
        load_blend(path)
    assert str(error.value) == (
        f"data.blend={path}: manifest {manifest} says vocab_size 3, but its shard {tmp_path / 'a'} "
        "holds token id 3 (largest of 5 tokens looked at): the manifest was edited since "
        "scripts/prepare_data.py wrote it; re-run that preparation (it rewrites the manifest), "
        "or set vocab_size: 4 or more in the blend")
    assert load_blend(_blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n"
                                       "vocab_size: 4\n")).vocab_size == 4  # the way out
    with pytest.raises(ConfigError, match=r"declares vocab_size: 3 but manifest .* goes past it"):
        load_blend(_blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\nvocab_size: 3\n"))


def test_the_ranks_read_a_blend_without_reading_its_datasets_again(tmp_path, monkeypatch):
    """`verify=False` (the ranks, and run.json at every save) gives the checked blend's sources,
    ids and tokenizer without opening an .idx or .bin: before, every rank and every save read
    each index whole and its CRC-32 (0.4 to 0.9 s for one 400 MB index, on every rank)."""
    from recipes.config import dataset_files
    from trainer.checkpoint.manifest import tokenizer_identity

    manifest = _manifest(tmp_path, {"a": 5, "b": 5})
    (tmp_path / "x").mkdir()
    bare = _dataset(tmp_path / "x", "c")
    path = _blend(tmp_path, f"train:\n  - {{manifest: {manifest}}}\n  - {{prefix: {bare}}}\n")
    checked = load_blend(path)

    def refuse(*args, **kwargs):
        raise AssertionError("a dataset's files were read")

    for name in ("read_index", "record", "largest_id", "document_ends"):
        monkeypatch.setattr(dataset_files, name, refuse)
    read = load_blend(path, verify=False)
    assert (read.train, read.eod_id, read.vocab_size) == (checked.train, checked.eod_id,
                                                          checked.vocab_size)
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", f"data.blend={path}"])
    assert tokenizer_identity(cfg)["vocab_size"] == 512
    with pytest.raises(AssertionError, match="files were read"):
        load_blend(path)


def test_a_blend_of_more_sources_than_megatrons_index_numbers_is_refused():
    """Megatron's BlendedDataset asserts fewer than 32,767 sources (int16): 32,766 fit, one more
    is one line, whatever data.documents."""
    from types import SimpleNamespace

    from recipes.config.path_rules import MOST_BLEND_SOURCES, blend_sources_problem

    cfg = apply_overrides(get_recipe("tiny_dp1"), ["data.source=blend", "data.blend=many.yaml"])
    fits = SimpleNamespace(train=(None,) * MOST_BLEND_SOURCES, valid=None)
    assert blend_sources_problem(cfg, fits) is None
    over = SimpleNamespace(train=(None,) * 2, valid=(None,) * (MOST_BLEND_SOURCES + 1))
    assert blend_sources_problem(cfg, over) == (
        "data.blend=many.yaml has 32,767 sources, more than the 32,766 Megatron's blending index "
        "numbers (int16); list each preparation's shards as one manifest entry (a manifest is "
        "one source)")

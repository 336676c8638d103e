"""Sharded preparation: cut in document order, the same bytes whatever runs it, finished after a
kill by the same command, and readable by Megatron-LM's tools.

One small corpus (two JSONL files of synthetic text with empty documents among them) and one
tokenizer trained on it are made once; a reference preparation with one worker is the bytes every
other run must reproduce: 2 and 4 local workers, Ray with 2 workers (one local Ray for the run),
a run whose driver is SIGKILLed and one whose worker is, each finished by the same command.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from data_prep.config import PrepareConfig
from data_prep.corpus import synthetic_documents
from data_prep.prepare import prepare
from recipes.config.blend import load_blend
from tests.hang import HANG_S

pytestmark = [
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]
SHARDS = {"num_shards": 6, "valid_shards": 1, "test_shards": 1, "held_out_fraction": 0.05}


def _corpus(folder: Path) -> Path:
    folder.mkdir()
    documents = list(synthetic_documents(1_500_000, seed=3))
    for index, part in enumerate((documents[: len(documents) // 3],
                                  documents[len(documents) // 3:])):
        rows = [{"text": "" if i % 17 == 5 else text} for i, text in enumerate(part)]
        (folder / f"part-{index}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(corpus folder, tokenizer folder, reference result) for the module."""
    root = tmp_path_factory.mktemp("shards")
    corpus = _corpus(root / "corpus")
    trained = prepare(PrepareConfig(input=str(corpus), output=str(root / "tok" / "t"),
                                    tokenizer="train:300", num_shards=1))
    reference = prepare(_cfg(corpus, trained.tokenizer_dir, root / "ref" / "web"))
    return corpus, trained.tokenizer_dir, reference


def _cfg(corpus: Path, tokenizer: Path, output: Path, **changes) -> PrepareConfig:
    return PrepareConfig(input=str(corpus), output=str(output), tokenizer=str(tokenizer),
                         **{**SHARDS, **changes})


def _outputs(folder: Path) -> dict[str, bytes]:
    """Every dataset and the manifest, by name (Megatron-LM's blend files hold absolute paths)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.suffix in (".bin", ".idx") or p.name == "web.json"}


def _read(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix)
    return [data[i].tolist() for i in range(len(data))]


def test_shards_cut_in_document_order_into_about_equal_tokens(made) -> None:
    corpus, tokenizer_dir, reference = made
    splits = [s.split for s in reference.shards]
    assert splits == ["train"] * 6 + ["valid", "test"]
    train = [s.tokens for s in reference.shards if s.split == "train"]
    assert max(train) < 1.25 * min(train)
    texts = [json.loads(line)["text"] for f in sorted(corpus.glob("*.jsonl"))
             for line in f.read_text().splitlines()]
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    stride = round(1 / SHARDS["held_out_fraction"])  # held out by the text's CRC-32
    residues = [zlib.crc32(t.encode()) % stride for t in texts]
    for split, residue in (("train", None), ("valid", stride - 1), ("test", stride - 2)):
        chosen = [t for t, r in zip(texts, residues, strict=True) if t and (
            r == residue if residue is not None else r < stride - 2)]
        assert len(chosen) > (10 if residue else 1000), split
        expected = [e.ids + [reference.tokenizer.eod_id] for e in tokenizer.encode_batch(chosen)]
        read = sum((_read(str(reference.output.parent / s.prefix)) for s in reference.shards
                    if s.split == split), [])
        assert read == expected, split
    assert reference.empty == sum(1 for t in texts if not t)


@pytest.mark.parametrize("workers", [2, 4])
def test_the_same_bytes_whatever_the_number_of_local_workers(made, tmp_path, workers) -> None:
    corpus, tokenizer_dir, reference = made
    result = prepare(_cfg(corpus, tokenizer_dir, tmp_path / "web", num_proc=workers))
    assert _outputs(tmp_path) == _outputs(reference.output.parent)
    assert result.redone == 8 and result.workers == workers


def test_ray_runs_each_shard_as_a_task_with_the_same_bytes(made, tmp_path, monkeypatch) -> None:
    """A local Ray started for the run (two CPUs), then stopped."""
    ray = pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    corpus, tokenizer_dir, reference = made
    prepare(_cfg(corpus, tokenizer_dir, tmp_path / "web", executor="ray", num_proc=2))
    assert _outputs(tmp_path) == _outputs(reference.output.parent)
    assert not ray.is_initialized()


def test_a_ray_head_that_does_not_answer_is_one_line_in_seconds(monkeypatch) -> None:
    """Before: Ray retried an unreachable GCS address for minutes, printing warnings."""
    import socket

    from data_prep.executors import gcs_unreachable, run_ray
    from plugins.protocol.errors import ConfigError

    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    assert gcs_unreachable("ray_address", f"127.0.0.1:{port}") is None
    listening.close()  # nothing listens there now: refused at once
    assert gcs_unreachable("ray_address", f"127.0.0.1:{port}", timeout=1) == (
        f"ray_address=127.0.0.1:{port}: no Ray head answers there (Connection refused within "
        "1 s); check the address and that `ray start --head` runs there, or leave ray_address "
        "and RAY_ADDRESS unset for a local Ray")
    assert gcs_unreachable("ray_address", "ray://head:10001") is None  # Ray Client: Ray's own
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "junk")
    with pytest.raises(ConfigError, match="^RAY_ADDRESS=junk is not a Ray address"):
        run_ray([], 1, None, lambda record: None)


@pytest.mark.parametrize("address, head", [
    ("ray://head:10001", ("client", "head", 10001)), ("10.0.0.5:6379", ("gcs", "10.0.0.5", 6379)),
    ("[::1]:6379", ("gcs", "::1", 6379)), ("auto", None), ("local", None), ("garbage", None),
    ("head:0", None), ("head:65536", None), ("http://head:6379", None), (":6379", None),
])
def test_a_ray_address_is_parsed_once_for_its_rule_and_its_connection(address, head) -> None:
    """`ray_head` is the one reading of an address: the form rule refuses what it cannot read
    (but auto and local), and only a GCS address is tried before ray.init."""
    from data_prep.config import ray_address_problem, ray_head

    assert ray_head(address) == head
    assert (ray_address_problem("ray_address", address) is None) == (
        head is not None or address in ("auto", "local"))


def _records(output: Path) -> dict[str, int]:
    folder = output.with_name(output.name + ".shards")
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")} if folder.is_dir() else {}


def _drive(cfg: PrepareConfig) -> None:
    prepare(cfg, progress=False)


def _kill_when(process, ready, victim) -> None:
    """SIGKILL `victim(found)` as soon as `ready()` finds something; wait for every process
    of the run to be gone (a killed driver's workers notice and exit)."""
    import psutil

    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and process.is_alive():
        found = ready()
        if found:
            children = psutil.Process(process.pid).children(recursive=True)
            os.kill(victim(found), signal.SIGKILL)
            process.join(HANG_S)
            psutil.wait_procs(children, timeout=HANG_S)
            return
        time.sleep(0.002)
    pytest.fail(f"the run ended before the kill (exit code {process.exitcode})")


@pytest.mark.parametrize("kill", ["driver", "worker"])
def test_a_killed_preparation_is_finished_by_the_same_command(made, tmp_path, kill) -> None:
    """The driver is a forked copy of this process (its imports done: no start-up to wait
    for), with two workers of its own; the same configuration then runs here."""
    corpus, tokenizer_dir, reference = made
    output = tmp_path / "web"
    cfg = _cfg(corpus, tokenizer_dir, output, num_proc=2)
    process = multiprocessing.get_context("fork").Process(target=_drive, args=(cfg,))
    process.start()
    work = tmp_path / ".web.work"
    if kill == "driver":  # once one shard is complete
        _kill_when(process, lambda: _records(output), lambda _: process.pid)
    else:  # a worker with a shard half written (its work file is named after its pid)
        _kill_when(process, lambda: [p for p in work.glob("*.bin") if p.stat().st_size],
                   lambda parts: int(parts[0].name.split(".")[-2]))
        assert process.exitcode == 1  # WorkerLost: "run the same command again"
    before = _records(output)
    assert len(before) < 8 and (before or kill == "worker")
    # Only complete shards are named like datasets: every recorded one, and any whose worker
    # the broken pool ended between publishing it and writing its record (redone below).
    named = {p.stem for p in tmp_path.iterdir() if p.suffix == ".idx"}
    assert named >= {Path(n).stem for n in before}
    reference_files = _outputs(reference.output.parent)
    for stem in named:
        for suffix in (".bin", ".idx"):
            name = stem + suffix
            assert (tmp_path / name).read_bytes() == reference_files[name], name
    result = prepare(cfg)
    after = _records(output)
    assert len(after) == 8 and all(after[name] == stamp for name, stamp in before.items())
    assert result.redone == 8 - len(before)
    assert _outputs(tmp_path) == _outputs(reference.output.parent)
    assert not work.exists()


def test_a_blend_names_the_manifest_its_valid_shards_and_megatron_lm_files(made) -> None:
    _, _, reference = made
    folder = reference.output.parent
    blend_file = folder / "blend.yaml"
    blend_file.write_text(f"train:\n  - {{manifest: {reference.manifest}}}\n"
                          f"valid:\n  - {{manifest: {reference.manifest}}}\n")
    blend = load_blend(str(blend_file))
    assert [Path(p).name for p in blend.valid[0].prefixes] == ["web_valid_00000"]
    per_split = load_blend(str(reference.per_split_args))
    args = load_blend(str(reference.data_args))
    assert per_split.train == args.train
    # Megatron-LM's files list the shards; the manifest is one source of the same shards.
    assert [s.prefix for s in per_split.train] == list(blend.train[0].prefixes)
    assert [s.weight for s in per_split.train] == [
        s.tokens for s in reference.shards if s.split == "train"]
    assert (args.eod_id, args.vocab_size) == (blend.eod_id, blend.vocab_size)
    saved = json.loads(reference.per_split_args.read_text())
    assert sorted(saved) == ["test", "train", "valid"]


def _samples(blend_path: Path, cache: Path, count: int = 12) -> list[list[int]]:
    """The first training samples the trainer would draw from a blend (Megatron Core's
    blended builder, as `trainer/data.py` calls it)."""
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe
    from trainer.data import megatron_sources

    cfg = apply_overrides(get_recipe("tiny_dp1"), [
        "data.source=blend", f"data.blend={blend_path}", "model.vocab_size=320",
        "train.train_iters=3"])
    train, _ = megatron_sources(cfg, load_blend(str(blend_path)), cache, 8,
                                cfg.train.train_iters * cfg.train.global_batch_size)
    return [train.dataset[i]["tokens"].tolist() for i in range(count)]


def _merged(prefixes: list[str], prefix: Path) -> str:
    """The shards as one dataset, merged by Megatron Core's own `IndexedDatasetBuilder`: what a
    preparation without shards writes for the same documents."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=IndexedDataset(prefixes[0]).index.dtype)
    for shard in prefixes:
        builder.add_index(shard)
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def test_the_trainer_draws_the_unsharded_samples_from_a_manifest(made, tmp_path) -> None:
    """The manifest trains on its shards as one dataset: the samples, in their order, of the
    same documents as one dataset. Megatron-LM's data-args file is its blend of the shards,
    the shards listed one by one with their token counts as weights, as Megatron-LM draws."""
    _, _, reference = made
    folder = reference.output.parent
    shards = [str(folder / s.prefix) for s in reference.shards if s.split == "train"]
    listed = tmp_path / "listed.yaml"
    listed.write_text("train:\n" + "".join(
        f"  - {{prefix: {folder / s.prefix}, weight: {s.tokens}}}\n"
        for s in reference.shards if s.split == "train"))
    named = tmp_path / "named.yaml"
    named.write_text(f"train:\n  - {{manifest: {reference.manifest}}}\n")
    facts = json.loads(reference.manifest.read_text())
    whole = tmp_path / "whole.yaml"
    whole.write_text(f"train:\n  - {{prefix: {_merged(shards, tmp_path / 'whole')}}}\n"
                     f"eod_id: {facts['eod_id']}\nvocab_size: {facts['vocab_size']}\n")
    drawn = {path.stem: _samples(path, tmp_path / f"cache_{path.stem}") for path in
             (named, whole, reference.data_args, listed)}
    assert drawn["named"] == drawn["whole"]
    assert drawn["web"] == drawn["listed"]  # <output>.data-args
    assert drawn["named"] != drawn["listed"]  # a blend of shards draws other samples
    assert len({tuple(s) for s in drawn["named"]}) == len(drawn["named"])  # distinct samples

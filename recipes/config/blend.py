"""Data blends: which prepared datasets a run trains on, with what weights, and the held-out split.

A blend is environment data, so it lives in `conf/data/<name>.yaml` and a run names it with
`data.blend=conf/data/<name>.yaml`. Megatron Core's own `BlendedMegatronDatasetBuilder` does the
blending; this module only reads and checks the file, before any rank starts:

    train:                                   # weighted sources of training samples
      - {manifest: data_cache/stdlib/stdlib.json, weight: 1.0}   # every shard of a preparation
      - {prefix: /data/web/web_0003, weight: 0.35}               # or one indexed dataset
    valid: [...]                             # optional held-out sources, or instead:
    split: [95, 5]                           # train / held-out shares of every train source
    eod_id: 0                                # optional when a manifest names it
    vocab_size: 4096
    tokenizer: /data/tokenizers/web          # optional: the tokenizer bare prefixes were made with

A manifest is the `<output>.json` that `scripts/prepare_data.py` writes (shards, EOD id, vocab
size). A manifest entry is one source: its shards of the split, in document order, reach Megatron
as one dataset (`manifest_dataset`, read by `trainer/sharded_dataset.py`), so sharded output
trains on the samples the same documents prepared unsharded give. Megatron-LM's own blend files
are read too: a `--data-args-path` file (`weight prefix weight prefix ...`) and a
`--per-split-data-args-path` JSON (`{"train": [weight, prefix, ...], "valid": [...], "test":
[...]}`); they list shards, which Megatron-LM blends, and are blended so here too. Their EOD id
and vocabulary come from the manifests in the prefixes' folders that list them.

Every dataset's files are checked here as well (`dataset_files.py`, O(index)): a damaged or
foreign `.idx`, a short `.bin`, files that are not the ones their manifest recorded, ids beyond
the declared vocabulary and an EOD id the data or the named tokenizer contradicts are refused
before any rank starts.

Relative paths are relative to the directory the run starts in. Mistakes (a missing
file or prefix, negative or all-zero weights, manifests that disagree, a damaged manifest, an
unknown key, named with the closest known one, since ignoring it would train on another mix;
`valid:` beside `split:`, since the split would be ignored; a `prepare:` entry
whose output the blend does not name) are one-line `ConfigError`s.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from plugins.protocol.errors import ConfigError
from recipes.config import dataset_files
from recipes.config.links import resolved
from recipes.config.yaml_file import not_a_file, read_yaml

MANIFEST_SPLIT = "#"  # <manifest>.json#<split>: a manifest's shards of a split, as one dataset
BLEND_KEYS = ("train", "valid", "split", "eod_id", "vocab_size", "tokenizer", "prepare")
ENTRY_KEYS = ("manifest", "prefix", "weight")


@dataclass(frozen=True)
class BlendSource:
    # The dataset Megatron is given: an indexed dataset (<prefix>.bin and <prefix>.idx), or a
    # manifest's split (`manifest_dataset`), whose shards are `shards`.
    prefix: str
    weight: float
    shards: tuple[str, ...] = ()  # a manifest's shard prefixes, in document order

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The indexed datasets on disk this source reads, in document order."""
        return self.shards or (self.prefix,)

    @property
    def named(self) -> str:
        """What the blend file names: the manifest, or the prefix."""
        found = manifest_split(self.prefix)
        return found[0] if found else self.prefix

    @property
    def label(self) -> str:
        """The source's path for logs: a manifest's without `.json` (its preparation's output)."""
        found = manifest_split(self.prefix)
        return str(Path(found[0]).with_suffix("")) if found else self.prefix


def manifest_dataset(manifest: str, split: str) -> str:
    """The one dataset path Megatron's builder is given for a manifest's shards of a split."""
    return f"{manifest}{MANIFEST_SPLIT}{split}"


def manifest_split(path: str) -> tuple[str, str] | None:
    """(manifest, split) of a `manifest_dataset` path; None for an indexed-dataset prefix."""
    manifest, mark, split = path.rpartition(MANIFEST_SPLIT)
    if not mark or not manifest or split not in ("train", "valid"):
        return None
    return manifest, split


def manifest_prefixes(manifest: str, split: str) -> list[str]:
    """The shard prefixes a manifest file lists for a split, beside it, in document order."""
    facts = json.loads(Path(manifest).read_text(encoding="utf-8"))
    folder = Path(manifest).parent
    return [str(folder / shard["prefix"]) for shard in manifest_shards(facts, split)]


@dataclass(frozen=True)
class Blend:
    path: str
    train: tuple[BlendSource, ...]
    valid: tuple[BlendSource, ...] | None  # None: held-out samples come from `split`
    split: tuple[float, float]  # train / held-out shares of each train source
    eod_id: int
    vocab_size: int
    notes: tuple[str, ...] = field(default=(), compare=False)  # warnings for the launcher
    # The tokenizer its datasets were made with (a manifest's folder, else the blend's own
    # `tokenizer:`), where one is named: what export ships and a checkpoint records.
    tokenizer: str | None = None

    def weights(self, sources: tuple[BlendSource, ...]) -> tuple[list[str], list[float]]:
        """Megatron's (prefixes, weights) form of one split."""
        return [s.prefix for s in sources], [s.weight for s in sources]


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"data.blend={path}: {message}")


def unknown_key_problem(keys: Any, known: tuple[str, ...], where: str) -> str | None:
    """A key the blend does not read: ignoring it would silently train on another mix (a
    misspelt `weight` weighs 1, a misspelt `valid` holds out by `split`). Names the closest
    known key, as prepare_data's own keys do."""
    for key in keys:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
        hint = f"did you mean '{near[0]}'?" if near else f"the keys are {', '.join(known)}"
        return f"unknown key '{key}' in {where}; {hint}"
    return None


def _read_yaml(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.blend={path} {not_a_file(path)}; name a blend file, e.g. "
                          "data.blend=conf/data/python_stdlib.yaml")
    loaded = _megatron_form(path, read_yaml(file, f"data.blend={path}"))
    if not isinstance(loaded, dict) or "train" not in loaded:
        raise _fail(path, "needs a 'train' list of {prefix|manifest, weight} entries")
    problem = unknown_key_problem(loaded, BLEND_KEYS, "the blend")
    if problem:
        raise _fail(path, problem)
    return loaded


def _megatron_pairs(path: str, words: list[Any]) -> list[dict[str, Any]]:
    """Megatron-LM's `weight prefix weight prefix ...` (or bare prefixes, equal weights)."""
    texts = [str(w) for w in words]

    def number(text: str) -> bool:
        try:
            float(text)
        except ValueError:
            return False
        return True

    if texts and len(texts) % 2 == 0 and all(number(t) for t in texts[0::2]):
        return [{"prefix": p, "weight": float(w)} for w, p in zip(texts[0::2], texts[1::2],
                                                                   strict=True)]
    if any(number(t) for t in texts):
        raise _fail(path, "is read as Megatron-LM's data-args form but its words are not "
                          "'weight prefix' pairs; give 'w1 prefix1 w2 prefix2 ...'")
    return [{"prefix": p, "weight": 1.0} for p in texts]


def _megatron_form(path: str, loaded: Any) -> Any:
    """Megatron-LM's blend files as this module's form: a `--data-args-path` file (YAML reads
    its words as one string) or a `--per-split-data-args-path` JSON of flat lists."""
    if isinstance(loaded, str):
        return {"train": _megatron_pairs(path, loaded.split())}
    if isinstance(loaded, dict) and isinstance(loaded.get("train"), list) and loaded[
        "train"
    ] and not any(isinstance(e, dict) for e in loaded["train"]):
        form = {"train": _megatron_pairs(path, loaded["train"])}
        if loaded.get("valid"):
            form["valid"] = _megatron_pairs(path, loaded["valid"])
        return form
    return loaded


def manifest_problem(manifest: Any) -> str | None:
    """What makes a manifest's JSON unusable as one (a hand edit, a damaged file): its shard
    lists must be lists of {prefix: <name>, ...}, and it must list a train shard. Found here,
    a rank would otherwise die on it (a TypeError, or 'a sharded dataset needs at least one
    shard')."""
    if not isinstance(manifest, dict) or "shards" not in manifest:
        return "it has no 'shards' list"
    for key in ("shards", "valid_shards", "test_shards"):
        shards = manifest.get(key, [])
        if not isinstance(shards, list):
            return f"its '{key}' is {type(shards).__name__}, not a list of shards"
        for index, shard in enumerate(shards):
            prefix = shard.get("prefix") if isinstance(shard, dict) else None
            if not isinstance(prefix, str) or not prefix:
                return f"{key}[{index}] has no 'prefix' name ({shard!r})"
    if not manifest["shards"]:
        return "its 'shards' list is empty"
    return None


def unprepared_problem(name: str) -> str:
    """A manifest the blend's own `prepare:` list makes, not made yet: the run makes it (before
    the paths are checked), so the advice is not to run prepare_data by hand."""
    return (f"manifest {name} is not prepared yet; the blend's prepare: entry makes it when a "
            "run with this blend starts (scripts/pretrain.py without check=paths)")


def _read_manifest(path: str, name: str, made: frozenset[Path] = frozenset()) -> dict[str, Any]:
    file = Path(name)
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        if not file.exists() and _resolved(name) in made:
            raise _fail(path, unprepared_problem(name)) from None
        raise _fail(path, f"manifest {name} is missing or not a prepare_data manifest; run "
                          "scripts/prepare_data.py or name its <output>.json") from None
    problem = manifest_problem(manifest)
    if problem:
        raise _fail(path, f"manifest {name} is not a prepare_data manifest ({problem}); run "
                          "scripts/prepare_data.py again with the same arguments to rewrite "
                          "it, or name its <output>.json")
    return manifest


def _manifest_beside(prefix: str) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(manifest file, manifest, shard record) of a manifest in the prefix's folder that lists
    it: a bare prefix (or a Megatron-LM blend's) is then known as well as a manifest entry.
    Pack index JSONs beside the datasets are passed over by name, and each manifest is parsed
    once per version (`_manifest_listing`): a folder of N shards asked about each of them
    would otherwise parse an N-shard manifest N times; the folder's candidate names are listed
    once per version of the folder (`_json_names`), not once per prefix."""
    target = Path(prefix)
    try:
        names = _folder_json_names(str(target.parent))
    except OSError:
        return None
    for name in names:
        file = os.path.join(target.parent, name)
        try:
            facts = os.stat(file)
        except OSError:
            continue
        listing = _manifest_listing(file, facts.st_mtime_ns, facts.st_size)
        if listing is not None and target.name in listing[1]:
            return file, listing[0], listing[1][target.name]
    return None


# A folder changed this recently is listed again: its mtime, in the file system's coarse ticks,
# may not yet tell a change made in the same tick (git's "racily clean" entries, likewise).
RECENT_NS = 2_000_000_000


def _folder_json_names(folder: str) -> tuple[str, ...]:
    """The JSON files of `folder` that may be manifests, listed once per version of the folder
    (an entry added or removed changes its mtime) unless it changed in the last RECENT_NS."""
    mtime_ns = os.stat(folder).st_mtime_ns
    if time.time_ns() - mtime_ns < RECENT_NS:
        return _json_names.__wrapped__(folder, mtime_ns)
    return _json_names(folder, mtime_ns)


@functools.lru_cache(maxsize=64)
def _json_names(folder: str, mtime_ns: int) -> tuple[str, ...]:
    """The JSON files of `folder` that may be manifests (pack index JSONs passed over), sorted."""
    return tuple(sorted(name for name in os.listdir(folder) if name.endswith(".json")
                        and not dataset_files.PACK_INDEX_JSON.search(name)))


@functools.lru_cache(maxsize=64)
def _manifest_listing(file: str, mtime_ns: int, size: int,
                      ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
    """(manifest, {shard prefix: shard record}) of a JSON file read as a manifest, or None when
    it is not one; cached by the file's version (path, mtime, size). Callers do not change it."""
    try:
        manifest = json.loads(Path(file).read_text(encoding="utf-8"))
        shards = [*manifest["shards"], *manifest.get("valid_shards", []),
                  *manifest.get("test_shards", [])]
        return manifest, {shard["prefix"]: shard for shard in reversed(shards)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def preparation_seed(prefix: str, manifest: str | None = None) -> int | None:
    """The `seed=` that `scripts/prepare_data.py` ran with for the dataset at `prefix`, from
    `manifest` when the blend named it (one look, however many shards it lists), else from the
    manifest beside the dataset that lists it (it seeds the pack order of the indexes it
    writes); None for a dataset no manifest lists, or a manifest that does not record one."""
    if manifest is not None:
        try:
            facts = os.stat(manifest)
        except OSError:
            return None
        listing = _manifest_listing(manifest, facts.st_mtime_ns, facts.st_size)
        data = listing[0] if listing else None
    else:
        found = _manifest_beside(prefix)
        data = found[1] if found else None
    settings = data.get("settings") if data else None
    seed = settings.get("seed") if isinstance(settings, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else None


@dataclass
class _Found:
    """What reading the sources learned: the manifests, and the bare prefixes' indexes."""

    manifests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    bare: list[dataset_files.IndexFacts] = field(default_factory=list)
    # Each manifest entry's first shard: ids past the vocabulary? (`_manifest_id_checks`)
    first_shards: list[tuple[str, dataset_files.IndexFacts]] = field(default_factory=list)
    made: frozenset[Path] = frozenset()  # manifests the blend's prepare: entries write
    verify: bool = True  # read every dataset's files (`load_blend`'s `verify`)


def _check_prefix(path: str, prefix: str) -> dataset_files.IndexFacts:
    missing = [suffix for suffix in (".bin", ".idx") if not Path(prefix + suffix).is_file()]
    if missing:
        raise _fail(path, f"prefix {prefix} has no {' or '.join(prefix + m for m in missing)}; "
                          "prepare it with scripts/prepare_data.py or fix the path")
    facts = dataset_files.read_index(prefix)
    if isinstance(facts, str):
        raise _fail(path, facts)
    problem = dataset_files.empty_problem(facts)
    if problem:
        raise _fail(path, problem)
    return facts


def _check_recorded(path: str, prefix: str, shard: dict[str, Any], manifest: str) -> None:
    problem = dataset_files.recorded_problem(prefix, shard, manifest)
    if problem:
        raise _fail(path, problem)


def _weight(path: str, entry: dict[str, Any]) -> float:
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(
        weight
    ) or weight < 0:
        raise _fail(path, f"weight {weight!r} of {entry} must be a finite number >= 0")
    return float(weight)


def _bare_source(path: str, entry: dict[str, Any], weight: float,
                 found: _Found) -> BlendSource:
    prefix = str(entry["prefix"])
    facts = _check_prefix(path, prefix) if found.verify else None
    beside = _manifest_beside(prefix)
    if beside is None:
        if facts is not None:
            found.bare.append(facts)
    else:
        name, manifest, shard = beside
        if found.verify:
            _check_recorded(path, prefix, shard, name)
        found.manifests.append((name, manifest))
    return BlendSource(prefix, weight)


def manifest_shards(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    """A manifest's shards for one split: a `valid:` entry takes its valid shards when it has
    them (`valid_shards=`), else all of its train shards (a dedicated held-out preparation)."""
    if split == "valid" and manifest.get("valid_shards"):
        return list(manifest["valid_shards"])
    return list(manifest["shards"])


def _sources(path: str, entries: Any, found: _Found,
             split: str = "train") -> tuple[BlendSource, ...]:
    """One source per entry (a manifest's shards are one dataset), every prefix checked."""
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "'train' and 'valid' must be non-empty lists of "
                          "{prefix|manifest, weight} entries")
    sources: list[BlendSource] = []
    for entry in entries:
        if not isinstance(entry, dict) or ("prefix" in entry) == ("manifest" in entry):
            raise _fail(path, f"entry {entry!r} needs exactly one of 'prefix' or 'manifest'")
        problem = unknown_key_problem(entry, ENTRY_KEYS, f"{split} entry {entry!r}")
        if problem:
            raise _fail(path, problem)
        weight = _weight(path, entry)
        if "prefix" in entry:
            sources.append(_bare_source(path, entry, weight, found))
            continue
        name = str(entry["manifest"])
        manifest = _read_manifest(path, name, found.made)
        found.manifests.append((name, manifest))
        folder = Path(name).parent
        prefixes = []
        for shard in manifest_shards(manifest, split):
            prefix = str(folder / shard["prefix"])
            if found.verify:
                facts = _check_prefix(path, prefix)
                _check_recorded(path, prefix, shard, name)
                if not prefixes:
                    found.first_shards.append((name, facts))
            prefixes.append(prefix)
        sources.append(BlendSource(manifest_dataset(name, split), weight, tuple(prefixes)))
    if sum(s.weight for s in sources) <= 0:
        raise _fail(path, "all weights are zero; give at least one source a positive weight")
    return tuple(sources)


def manifest_tokenizer(name: str, manifest: dict[str, Any]) -> Path | None:
    """The tokenizer folder (or file) a manifest names, beside it; None when it names none."""
    named = manifest.get("tokenizer")
    return Path(name).parent / str(named) if named else None


@functools.lru_cache(maxsize=64)
def _tokenizer_digest(file: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def tokenizer_digest(tokenizer: Path) -> str | None:
    """SHA-256 of a tokenizer's `tokenizer.json` (a folder's, or the file itself): what makes
    two tokenizers the same; None when it cannot be read here."""
    file = tokenizer / dataset_files.TOKENIZER_FILE if tokenizer.is_dir() else tokenizer
    try:
        stat = file.stat()
        return _tokenizer_digest(str(file), stat.st_size, stat.st_mtime_ns)
    except OSError:
        return None


def tokenizer_problem(path: str, tokenizers: list[tuple[str, Path]]) -> str | None:
    """The blend's datasets were made with one tokenizer: (what names it, its folder) pairs
    whose `tokenizer.json` can be read must all hold the same bytes. Else the one line naming
    the first two that differ: ids of one mean other text in the other, and the model learns
    both at once; export would ship one of them."""
    first: tuple[str, Path, str] | None = None
    for who, folder in tokenizers:
        digest = tokenizer_digest(folder)
        if digest is None:
            continue
        if first is None:
            first = (who, folder, digest)
        elif digest != first[2]:
            return (f"data.blend={path}: {first[0]} was prepared with tokenizer {first[1]} and "
                    f"{who} with tokenizer {folder}, which differ (their tokenizer.json are not "
                    "the same); blend datasets prepared with one tokenizer: prepare the others "
                    f"again with tokenizer={first[1]}")
    return None


def _named_tokenizers(loaded: dict[str, Any], found: _Found) -> list[tuple[str, Path]]:
    """(what names it, tokenizer) for every manifest of the blend, then its own `tokenizer:`."""
    named = [(f"manifest {name}", folder) for name, manifest in found.manifests
             if (folder := manifest_tokenizer(name, manifest)) is not None]
    if loaded.get("tokenizer") is not None:
        named.append(("its tokenizer:", Path(str(loaded["tokenizer"])).expanduser()))
    return list(dict.fromkeys(named))


def _token_facts(path: str, loaded: dict[str, Any], found: _Found) -> tuple[int, int]:
    """EOD id and vocabulary size: from the file, else from the manifests (which must agree,
    and have been made with one tokenizer)."""
    problem = tokenizer_problem(path, _named_tokenizers(loaded, found))
    if problem:
        raise ConfigError(problem)
    facts = [manifest for _, manifest in found.manifests]
    pairs = {(m.get("eod_id"), m.get("vocab_size")) for m in facts}
    if len(pairs) > 1:
        raise _fail(path, f"its manifests disagree on (eod_id, vocab_size): {sorted(pairs)}; "
                          "blend datasets prepared with one tokenizer")
    eod, vocab = pairs.pop() if pairs else (None, None)
    _declared_against_manifests(path, loaded, found, eod, vocab)
    eod, vocab = loaded.get("eod_id", eod), loaded.get("vocab_size", vocab)
    if not isinstance(eod, int) or not isinstance(vocab, int) or not 0 <= eod < vocab:
        raise _fail(path, "needs eod_id and vocab_size (integers, 0 <= eod_id < vocab_size); "
                          "name a manifest or set them in the file")
    return eod, vocab


def _declared_against_manifests(path: str, loaded: dict[str, Any], found: _Found,
                                eod: Any, vocab: Any) -> None:
    """A blend's own eod_id / vocab_size cannot contradict the manifests it names."""
    if not found.manifests:
        return
    name = found.manifests[0][0]
    declared = loaded.get("vocab_size")
    if isinstance(declared, int) and isinstance(vocab, int) and declared < vocab:
        raise _fail(path, f"declares vocab_size: {declared} but manifest {name} holds token ids "
                          f"up to {vocab - 1}; set vocab_size: {vocab} (or remove it)")
    declared = loaded.get("eod_id")
    if isinstance(declared, int) and isinstance(eod, int) and declared != eod:
        raise _fail(path, f"declares eod_id: {declared} but manifest {name} was prepared with "
                          f"eod_id {eod}; set eod_id: {eod} (or remove it)")


def _manifest_id_checks(path: str, loaded: dict[str, Any], found: _Found, vocab: int) -> None:
    """Each manifest's first shard (the bytes its fingerprint reads, `dataset_files.largest_id`)
    holds no id past the vocabulary the blend takes from the manifests: their vocab_size is
    otherwise trusted, and one edited smaller would pass here only to be advised as the
    model's size."""
    declared = "vocab_size" in loaded  # then no smaller than the manifests' (checked before)
    for name, facts in found.first_shards:
        if problem := dataset_files.manifest_vocabulary_problem(name, facts, vocab, declared):
            raise _fail(path, problem)


def _bare_checks(path: str, loaded: dict[str, Any], found: _Found, eod: int,
                 vocab: int) -> tuple[str, ...]:
    """Bare prefixes no manifest describes: a bounded scan of their ids, their documents'
    last tokens and the named tokenizer's EOD against eod_id; the warning when nothing can
    vouch for eod_id."""
    for facts in found.bare:
        problem = (dataset_files.vocabulary_problem(facts, vocab, "the blend's")
                   or dataset_files.eod_problem(facts, eod))
        if problem:
            raise _fail(path, problem)
    tokenizer = loaded.get("tokenizer")
    if tokenizer is not None:
        named = dataset_files.tokenizer_eod(str(tokenizer))
        if isinstance(named, str):
            raise _fail(path, named)
        if named[0] != eod:
            raise _fail(path, f"eod_id: {eod} disagrees with tokenizer {tokenizer}, whose "
                              f"end-of-document {named[1]} is id {named[0]}; set eod_id: "
                              f"{named[0]} or name the tokenizer the data was made with")
        return ()
    if found.bare and not found.manifests:
        return (f"data.blend={path}: eod_id {eod} of prefix {found.bare[0].prefix} is not "
                "checked against a tokenizer (no manifest lists it); add tokenizer: <folder> "
                "to the blend to check it",)
    return ()


def valid_with_split_problem(loaded: dict[str, Any]) -> str | None:
    """`valid:` sources beside `split:`: the split divides every train source into train and
    held-out samples, which a valid list replaces, so the split would be ignored and the run
    would train on all of each train source, not the share the file asks for."""
    if loaded.get("valid") is None or "split" not in loaded:
        return None
    return (f"names both valid: sources and split: {loaded['split']!r}; the split divides the "
            "train sources into train and held-out samples, which the valid: sources replace "
            "(the split would be ignored); keep one: remove split:, or remove valid:")


def _split(path: str, loaded: dict[str, Any]) -> tuple[float, float]:
    split = loaded.get("split", [95, 5])
    ok = isinstance(split, list) and len(split) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in split)
    if not ok or split[0] <= 0 or split[1] <= 0:
        raise _fail(path, f"split {split!r} must be [train, held-out] shares, both > 0, "
                          "e.g. split: [95, 5]")
    return float(split[0]), float(split[1])


def load_blend(path: str, verify: bool = True) -> Blend:
    """Read and check a blend file (files on disk included); raises a one-line ConfigError.
    `verify=False` reads the blend and its manifests but not the datasets' files (each `.idx`
    whole, a CRC-32 of it, the bounded id scans): what a run's ranks do once the check before
    launch has read them, so a corpus of 10^9 documents (a 12 GB index) is read once per
    launch, not once per rank."""
    loaded = _read_yaml(path)
    problem = valid_with_split_problem(loaded) or next(iter(prepare_problems(loaded)), None)
    if problem:  # the first; prepare_missing_data says every one before any preparation
        raise _fail(path, problem)
    found = _Found(made=made_manifests(loaded), verify=verify)
    train = _sources(path, loaded["train"], found)
    valid = (_sources(path, loaded["valid"], found, "valid")
             if loaded.get("valid") is not None else None)
    eod, vocab = _token_facts(path, loaded, found)
    _manifest_id_checks(path, loaded, found, vocab)
    notes = _bare_checks(path, loaded, found, eod, vocab)
    named = _named_tokenizers(loaded, found)
    return Blend(path=path, train=train, valid=valid, split=_split(path, loaded), eod_id=eod,
                 vocab_size=vocab, notes=notes, tokenizer=str(named[0][1]) if named else None)


# ----------------------------------------------------------------------------- prepare: entries
# The rules a `prepare:` entry (data_prep/blend_prepare.py runs them) meets that need only the
# blend: the list's shape and what each entry's output makes. Its keys are prepare_data's own
# (data_prep/config.py, a floor above this one): blend_prepare.prepare_problems adds them.


def prepare_list_problem(entries: Any) -> str | None:
    """`prepare:` is not a list of {key: value} entries (one prepare_data call each)."""
    if entries is None or isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
        return None
    return "'prepare' must be a list of {input, output, tokenizer, ...} entries (prepare_data " \
           "arguments)"


def prepare_entry_name(index: int, entry: dict[str, Any]) -> str:
    """How a message names a `prepare:` entry: its place and its output."""
    output = entry.get("output")
    return f"prepare[{index}]" + (f" (output={output})" if output is not None else "")


def _resolved(path: str) -> Path:
    return resolved(Path(path).expanduser())


def makes(output: str, named: str) -> bool:
    """Whether a preparation with `output=` makes what a blend names: its manifest
    (`<output>.json`) or one of its datasets (`<output>_<name>`, a bare prefix)."""
    made, target = _resolved(output), _resolved(named)
    if target == made.with_name(made.name + ".json"):
        return True
    return target.parent == made.parent and target.name.startswith(made.name + "_")


def named_datasets(loaded: dict[str, Any]) -> list[str]:
    """The manifests and prefixes a blend's `train:` and `valid:` entries name."""
    return [str(entry[key]) for split in ("train", "valid")
            for entry in (loaded.get(split) if isinstance(loaded.get(split), list) else [])
            if isinstance(entry, dict) for key in ("manifest", "prefix") if key in entry]


def prepare_output_problem(index: int, entry: dict[str, Any], named: list[str]) -> str | None:
    """An entry whose output the blend does not train on: it would prepare all its data, and
    the run would then find the manifest the blend names missing."""
    output = entry.get("output")
    if output is None or any(makes(str(output), name) for name in named):
        return None
    listed = ", ".join(named[:3]) or "nothing"
    return (f"{prepare_entry_name(index, entry)} makes {output}.json, which its train:/valid: "
            f"entries do not name (they name {listed}); set the entry's output to the prefix "
            "of a manifest they name (<output>.json), or name its manifest in train:")


def prepare_problems(loaded: dict[str, Any]) -> list[str]:
    """The blend-side problems of its `prepare:` entries, one line each."""
    entries = loaded.get("prepare")
    problem = prepare_list_problem(entries)
    if problem or not entries:
        return [problem] if problem else []
    named = named_datasets(loaded)
    found = [prepare_output_problem(index, entry, named) for index, entry in enumerate(entries)]
    return [message for message in found if message]


def made_manifests(loaded: dict[str, Any]) -> frozenset[Path]:
    """The manifests (resolved) a blend's `prepare:` entries write."""
    entries = loaded.get("prepare")
    if not isinstance(entries, list):
        return frozenset()
    return frozenset(_resolved(f"{entry['output']}.json") for entry in entries
                     if isinstance(entry, dict) and entry.get("output") is not None)


def split_documents(documents: int, split: tuple[float, float]) -> tuple[int, int]:
    """The documents of a source that Megatron Core gives the train and held-out splits: the
    split normalized, its bookends (0, a) and (a, a + b) each rounded to a document
    (`megatron/core/datasets/blended_megatron_dataset_builder.py:470-471`)."""
    total = split[0] + split[1]
    first, second = split[0] / total, split[1] / total
    cut, end = int(round(first * documents)), int(round((first + second) * documents))
    return cut, end - cut


def empty_split_problem(blend: Blend) -> str | None:
    """A train source whose train or held-out share of its documents is none at all. Megatron
    Core then builds a split of zero tokens and counts epochs until they hold the samples asked
    for, which never ends: the dataset builder hangs every rank
    (`megatron/core/datasets/gpt_dataset.py:693-695`). A blend with its own `valid` sources
    uses each source whole."""
    if blend.valid is not None:
        return None
    for source in blend.train:
        counts = [dataset_files.document_count(prefix) for prefix in source.prefixes]
        if None in counts:
            continue
        documents = sum(counts)
        train, heldout = split_documents(documents, blend.split)
        if min(train, heldout) == 0:
            which = "held-out" if heldout == 0 else "train"
            share = blend.split[1] if heldout == 0 else blend.split[0]
            return (f"data.blend={blend.path}: source {source.named} has {documents} "
                    f"document{'s' if documents != 1 else ''}, too few for its {which} share "
                    f"(split {blend.split[0]:g}/{blend.split[1]:g} gives it 0; Megatron's "
                    f"dataset builder would wait forever); raise the {which} share above "
                    f"{share:g}, give the blend valid: sources, or prepare more documents")
    return None


def blend_document(path: str) -> Any:
    """The YAML document of a blend file, or None where it cannot be read here (missing, not
    UTF-8, not YAML): for readers that only look into a blend, the path rules refusing it in
    their own words."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        return None


def named_paths(path: str) -> list[str]:
    """Every file and folder a blend file names, read without checking any of them: the blend
    itself, its manifests and prefixes (with their folders' tokenizer folders, from manifests
    that can be read here), its named tokenizer. What a container must mount for the blend to
    be read where the job runs; a blend that cannot be read here names only itself."""
    try:
        loaded = _megatron_form(path, blend_document(path))
    except ConfigError:
        return [path]
    if not isinstance(loaded, dict):
        return [path]
    found = [path]
    for split in ("train", "valid"):
        for entry in loaded.get(split) or []:
            if not isinstance(entry, dict):
                continue
            found += [str(entry[key]) for key in ("manifest", "prefix") if key in entry]
            found += _manifest_tokenizer(str(entry.get("manifest", "")))
    if loaded.get("tokenizer") is not None:
        found.append(str(loaded["tokenizer"]))
    return list(dict.fromkeys(found))


def _manifest_tokenizer(manifest: str) -> list[str]:
    """The tokenizer folder a readable manifest names (beside it), else nothing."""
    try:
        named = json.loads(Path(manifest).read_text(encoding="utf-8")).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(Path(manifest).parent / str(named))] if named else []

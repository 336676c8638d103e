"""The blend files in conf/data that make their own data (`prepare:` entries) name only what exists
or what a preparation writes, so the recipes that train on them run on a fresh machine.

A preparation with `output=PREFIX` writes `PREFIX.json` (the manifest) and `PREFIX.tokenizer/`
(a Hugging Face folder holding tokenizer.json; data_prep/prepare.py). A blend whose second
preparation reuses the first one's tokenizer, or whose sources are another blend's manifests
under data_cache/, must name those files, not files no preparation makes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from data_prep.config import OUTPUT_SUFFIXES

REPO = Path(__file__).resolve().parents[2]


def blends() -> list[Path]:
    return sorted((REPO / "conf" / "data").glob("*.yaml"))


def preparations(blend: Path) -> list[dict]:
    return (yaml.safe_load(blend.read_text(encoding="utf-8")) or {}).get("prepare") or []


def prepared_files() -> set[str]:
    """Every path a `prepare:` entry of any blend writes (the tokenizer folder's file too)."""
    written = set()
    for blend in blends():
        for entry in preparations(blend):
            written |= {entry["output"] + suffix for suffix in OUTPUT_SUFFIXES}
            written.add(entry["output"] + ".tokenizer/tokenizer.json")
    return written


def unmade(blend: Path, written: set[str]) -> list[str]:
    """The data_cache/ paths the blend names (tokenizers, manifests) that no preparation makes;
    paths elsewhere are the user's own."""
    loaded = yaml.safe_load(blend.read_text(encoding="utf-8")) or {}
    names = [entry["tokenizer"] for entry in preparations(blend)
             if not str(entry["tokenizer"]).startswith("train:")]
    names += [source["manifest"] for split in ("train", "valid")
              for source in loaded.get(split) or [] if "manifest" in source]
    return [name for name in names if name.startswith("data_cache/") and name not in written]


@pytest.mark.parametrize("blend", blends(), ids=lambda blend: blend.name)
def test_a_blend_names_only_what_a_preparation_makes(blend: Path):
    assert unmade(blend, prepared_files()) == []


def test_a_tokenizer_no_preparation_writes_is_found(tmp_path):
    """The shape of the mistake this guards: `<output>.tokenizer.json` instead of the folder."""
    blend = tmp_path / "two.yaml"
    blend.write_text(yaml.safe_dump({
        "train": [{"manifest": "data_cache/b/b.json", "weight": 1.0}],
        "prepare": [{"input": "x.txt", "output": "data_cache/b/b",
                     "tokenizer": "data_cache/python_stdlib/stdlib.tokenizer.json"}]}))
    written = prepared_files() | {"data_cache/b/b.json"}
    assert unmade(blend, written) == ["data_cache/python_stdlib/stdlib.tokenizer.json"]


# --- Nemotron 3 Super's published blends ------------------------------------------------------

def super_weights(stage: str, split: str = "train") -> dict[str, float]:
    loaded = yaml.safe_load((REPO / "conf" / "data" / f"nemotron3_super_{stage}.yaml").read_text())
    return {Path(entry["manifest"]).stem: entry["weight"] for entry in loaded[split]}


@pytest.mark.parametrize("phase", ["phase1", "phase2"])
def test_a_super_phase_blend_is_nvidias_shares_of_the_whole(phase):
    """NVIDIA's weights are percentages of the internal blend: with the internal-only
    categories listed, a phase's add up to 100 (a mistyped weight does not), and held-out data
    is weighted as training is."""
    assert sum(super_weights(phase).values()) == pytest.approx(100.0)
    assert super_weights(phase, "valid") == super_weights(phase)


def test_the_super_long_context_blend_is_one_fifth_document_qa_over_phase_2():
    """NVIDIA's docs: 20% document QA, 80% phase-2 data, whose weights are phase 2's."""
    weights = super_weights("long_context")
    qa = weights.pop("long-context-doc-qa")
    assert qa / (qa + sum(weights.values())) == pytest.approx(0.2)
    assert weights == super_weights("phase2")

"""From your corpus back to Hugging Face, as a user gets there: own corpus -> `prepare_data.py`
(a BPE trained on it) -> a blend -> `pretrain.py` -> `convert.py export` -> transformers.

- Tokenizers are checked together: a blend of datasets prepared with two tokenizers is refused
  in one line naming both (one prepared with the same tokenizer files passes); a model
  vocabulary much larger than the tokenizer's is warned about and a smaller one refused, in
  one line each; resuming a checkpoint with another tokenizer's data names the saved and the
  given tokenizer folders and the setting to change.
- Exports generate: each tiny Hugging Face-shaped family (Llama, Mixtral, NemotronH;
  recipes/hf_tiny.py) is trained from scratch and exported; transformers loads the folder with
  AutoTokenizer and AutoModelForCausalLM and generates greedily. The corpus is three short
  documents, repeated: in 60 steps every model learns to finish each and then end the
  document, so a generation must stop at the data's end-of-document id (0), which only the ids
  the export writes into config.json and generation_config.json tell transformers (its Llama
  and NemotronH defaults are eos 2). Every file of the export has one mode, and the export
  names the tokenizer it ships.

Preparing a corpus and training a one-rank model each compute on one core, so the fixtures run
the independent ones side by side, one per core (tests/side_by_side.py): the two BPEs trained
together, then the families, while the tests check what is already done.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S
from tests.side_by_side import selected_tests, side_by_side

pytestmark = [pytest.mark.dist, pytest.mark.scripts_unit]

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["one two three four", "five six seven eight", "nine ten eleven twelve"]
PROMPTS = {"one two": " three four", "five": " six seven eight", "nine ten": " eleven twelve"}
STEPS = 60
FAMILIES = {"llama": [], "mixtral": [],
            # its recipe keeps the byte vocabulary (256); the corpus's BPE has 293 ids
            "nemotron_h": ["model.vocab_size=300"]}


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args],
                            capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def prepare(folder: Path, documents: list[str], tokenizer: str, *more: str) -> Path:
    """`documents`, repeated, prepared by prepare_data.py with `tokenizer`: the manifest. No
    library warning reaches the user (Megatron's "Could not determine rank" when it reads the
    datasets back for the pack index: trainer/entry/library_noise.py)."""
    folder.mkdir(parents=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": documents[i % len(documents)]}) + "\n"
                              for i in range(300)))
    result = run("prepare_data.py", f"input={corpus}", f"output={folder / 'data' / 'words'}",
                 f"tokenizer={tokenizer}", *more)
    assert result.stderr == "", result.stderr[-2000:]
    return folder / "data" / "words.json"


def blend_of(path: Path, *manifests: Path) -> Path:
    path.write_text("train:\n" + "".join(f"  - {{manifest: {m}}}\n" for m in manifests)
                    + "split: [90, 10]\n")
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    """The user's corpus prepared with a BPE trained on it (300 ids at most); another corpus
    with a BPE of its own; a third prepared with the first one's tokenizer. Their manifests."""
    root = tmp_path_factory.mktemp("corpora")
    with side_by_side() as pool:
        words = pool.submit(prepare, root / "words", DOCUMENTS, "train:300", "pack_size=32")
        other = pool.submit(prepare, root / "other", ["alpha beta gamma", "delta epsilon"],
                            "train:300")
        same = prepare(root / "same", ["four three two one"], str(tokenizer_of(words.result())))
    return {"words": words.result(), "other": other.result(), "same": same}


def tokenizer_of(manifest: Path) -> Path:
    return manifest.parent / json.loads(manifest.read_text())["tokenizer"]


@pytest.fixture(scope="module")
def blend(corpora, tmp_path_factory) -> Path:
    return blend_of(tmp_path_factory.mktemp("blend") / "words.yaml", corpora["words"])


def train(blend: Path, family: str, run_dir: Path) -> Path:
    """The family's tiny model trained on the blend: its run directory."""
    run("pretrain.py", f"recipe=hf_tiny_{family}", "data.source=blend", f"data.blend={blend}",
        f"train.train_iters={STEPS}", f"run_dir={run_dir}", "logging.progress_bar=false",
        "plugins.logging.loss_curve=false", *FAMILIES[family])
    return run_dir


def families_read(tests: set[str]) -> list[str]:
    """The families the selected tests train (the resume test reads the Llama's checkpoint)."""
    resume = "test_a_resume_on_another_tokenizers_data_names_both_and_the_setting" in tests
    return [family for family in FAMILIES if (resume and family == "llama") or
            f"test_a_trained_model_exports_and_generates_until_its_end_of_document[{family}]"
            in tests]


@pytest.fixture(scope="module", autouse=True)
def trained(request, blend, tmp_path_factory):
    """`trained(family)`: the run directory of the family's tiny model trained on the blend.
    Every family a selected test reads starts training with the module (autouse), one per core,
    in the order the tests read them, beside the tests that need no model; each test waits
    only for its own."""
    with side_by_side() as pool:
        runs = {family: pool.submit(train, blend, family, tmp_path_factory.mktemp(family) / "run")
                for family in families_read(selected_tests(request))}
        yield lambda family: runs[family].result()


def refused(script: str, *args: str) -> list[str]:
    """The lines of a refusal (exit code 2) on stderr."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args],
                            capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr.splitlines()


def test_a_blend_of_two_tokenizers_is_refused_in_one_line_naming_both(corpora, tmp_path):
    mixed = blend_of(tmp_path / "mixed.yaml", corpora["words"], corpora["other"])
    assert refused("pretrain.py", "recipe=hf_tiny_llama", "data.source=blend",
                   f"data.blend={mixed}", "check=paths") == [
        f"error: data.blend={mixed}: manifest {corpora['words']} was prepared with tokenizer "
        f"{tokenizer_of(corpora['words'])} and manifest {corpora['other']} with tokenizer "
        f"{tokenizer_of(corpora['other'])}, which differ (their tokenizer.json are not the "
        "same); blend datasets prepared with one tokenizer: prepare the others again with "
        f"tokenizer={tokenizer_of(corpora['words'])}"]
    same = blend_of(tmp_path / "same.yaml", corpora["words"], corpora["same"])
    ok = run("pretrain.py", "recipe=hf_tiny_llama", "data.source=blend", f"data.blend={same}",
             "check=paths")  # another folder, the same tokenizer files
    assert ok.stdout.startswith("check=paths: every path hf_tiny_llama names is in place")


def test_a_vocabulary_that_does_not_fit_the_tokenizer_is_said_in_one_line(blend, corpora):
    tokenizer = tokenizer_of(corpora["words"])
    ids = json.loads(corpora["words"].read_text())["vocab_size"]
    larger = run("pretrain.py", "recipe=hf_tiny_llama", "data.source=blend",
                 f"data.blend={blend}", "model.vocab_size=4096", "check=paths")
    assert larger.stderr.splitlines() == [
        f"warning: model.vocab_size=4096 is {4096 / ids:.1f}x the {ids} ids of data.blend="
        f"{blend}'s tokenizer {tokenizer}: {4096 - ids} embedding and output rows never see a "
        f"token and the output layer computes them every step; set model.vocab_size={ids} "
        "(Megatron pads it for TP), or prepare the data with the model's own tokenizer"]
    assert refused("pretrain.py", "recipe=tiny_dp1", "data.source=blend", f"data.blend={blend}",
                   "check=paths") == [
        f"error: data.blend={blend} holds token ids up to {ids - 1}, but model.vocab_size=256; "
        f"set model.vocab_size={ids} (its tokenizer {tokenizer} has {ids} ids), or prepare the "
        "data with a tokenizer of at most 256 ids"]


def test_a_resume_on_another_tokenizers_data_names_both_and_the_setting(trained, blend,
                                                                         corpora, tmp_path):
    checkpoints = trained("llama") / "checkpoints"
    other = blend_of(tmp_path / "other.yaml", corpora["other"])
    [line] = refused("pretrain.py", "recipe=hf_tiny_llama", "data.source=blend",
                     f"data.blend={other}", f"checkpoint.load={checkpoints}",
                     f"run_dir={tmp_path / 'run'}")
    ids = {name: json.loads(corpora[name].read_text())["vocab_size"] for name in corpora}
    assert line == (
        f"error: checkpoint.load={checkpoints} was trained on another tokenizer's ids: it was "
        f"trained with tokenizer {tokenizer_of(corpora['words']).resolve()} (vocab "
        f"{ids['words']}, EOD 0), this run's data uses tokenizer "
        f"{tokenizer_of(corpora['other']).resolve()} (vocab {ids['other']}, EOD 0); set "
        f"data.blend back to a blend prepared with the saved tokenizer (the saved run had "
        f"data.blend={blend}), or train from scratch without checkpoint.load")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_trained_model_exports_and_generates_until_its_end_of_document(family, blend,
                                                                         corpora, trained,
                                                                         tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, out = trained(family), tmp_path / "hf"
    exported = run("convert.py", "export", f"checkpoint={run_dir / 'checkpoints'}",
                   f"out={out}")
    assert exported.stderr == ""  # no Transformer Engine / Apex fallback warnings
    manifest = corpora["words"]
    assert (f"tokenizer: {tokenizer_of(manifest) / 'tokenizer.json'} (data.blend={blend}: "
            f"manifest {manifest}, end of document '<|endoftext|>' = id 0)\n") in exported.stdout
    ids = {"bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0}
    config = json.loads((out / "config.json").read_text())
    assert {key: config[key] for key in ids} == ids
    assert json.loads((out / "generation_config.json").read_text()) == ids
    assert len({path.stat().st_mode for path in out.iterdir()}) == 1  # safetensors' too

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 0)
    for prompt, rest in PROMPTS.items():
        given = tokenizer(prompt, return_tensors="pt")["input_ids"]
        new = model.generate(given, max_new_tokens=20, do_sample=False)[0, given.shape[1]:]
        assert tokenizer.decode(new[:-1]) == rest, (prompt, new.tolist())
        assert new[-1].item() == 0  # ended by its end of document, long before 20 tokens

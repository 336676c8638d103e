"""Loads that Megatron would fail on inside every rank (or that would quietly do nothing),
refused by the launching process in one line from hand-made checkpoint folders: a step of this
project whose `run.json` is gone or broken, optimizer state of the other kind of optimizer, a
Hugging Face import loaded as a whole run or into another shape, and a resume that would train
no step. Each rule fires alone; what still loads is shown beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import config_dict, save_config
from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from tests.dcp_steps import dcp_step
from trainer.checkpoint.format import is_hf_import, is_project_step
from trainer.checkpoint.manifest import (
    file_record,
    iterations_problem,
    layout_record,
    manifest_problem,
    optimizer_kind_problem,
    precision_problem,
    tokenizer_identity,
)
from trainer.checkpoint.preflight import checkpoint_preflight, foreign_preflight


def _cfg(*overrides: str, recipe: str = "tiny_dp1"):
    return apply_overrides(get_recipe(recipe), ["data.source=synthetic", *overrides])


def _step(path: Path, cfg=None, step: int = 4) -> Path:
    """Megatron's marker and one shard; with `cfg`, the run.json a save of it writes."""
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (path / "__0_0.distcp").write_bytes(b"w" * 32)
    if cfg is not None:
        manifest = {
            "format": 1, "step": step, "consumed_samples": 8 * step,
            "consumed_tokens": 1000 * step, "world_size": cfg.layout.world_size,
            "layout": layout_record(cfg.layout), "padded_vocab_size": cfg.layout.padded_vocab,
            "versions": {"torch": "t", "megatron-core": "m", "mcore-recipes": "p"},
            "tokenizer": tokenizer_identity(cfg), "config": config_dict(cfg),
            "files": {p.name: file_record(p) for p in path.iterdir()},
        }
        (path / "run.json").write_text(json.dumps(manifest))
    return path


def _refusal(cfg) -> str:
    with pytest.raises(ConfigError) as caught:
        checkpoint_preflight(cfg)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- 1. a step of this project without a readable run.json ----------------------------------

@pytest.mark.parametrize(("damage", "said"), [
    (lambda p: p.unlink(), "step_0000004/run.json is missing (every step this project saves "
                           "has one)"),
    (lambda p: p.write_text("{\n"), "step_0000004/run.json cannot be read (not valid JSON: "
                                     "cut short or overwritten?)"),
    (lambda p: p.write_text('{"files": {}}'), "step_0000004/run.json cannot be read (it has no "
                                               "step, consumed_samples, consumed_tokens, "
                                               "versions)"),
])
def test_a_step_without_a_readable_run_json_is_refused_with_the_fallback(tmp_path, damage, said):
    root = tmp_path / "checkpoints"
    _step(root / "step_0000002", _cfg(), step=2)
    step = _step(root / "step_0000004", _cfg())
    (root / "latest").write_text("step_0000004")
    damage(step / "run.json")
    assert manifest_problem(step) == said
    assert _refusal(_cfg(f"checkpoint.load={root}", "train.train_iters=6")) == (
        f"checkpoint.load={root}: {said}; fall back to the previous complete checkpoint with "
        f"checkpoint.load={root / 'step_0000002'} (or delete {step}: the root then resumes "
        "from it)")
    # a weights-only start reads the same run.json first (shape): refused alike
    assert "run.json" in _refusal(_cfg(f"checkpoint.load={root}",
                                       "checkpoint.load_model_only=true"))


@pytest.mark.parametrize(("key", "value", "said"), [
    ("step", "abc", 'its step is "abc", not a whole number'),
    ("step", None, "its step is null, not a whole number"),
    ("consumed_samples", 3.5, "its consumed_samples is 3.5, not a whole number"),
    ("consumed_tokens", -1, "its consumed_tokens is -1, not a whole number"),
    ("versions", [], "its versions is [], not a mapping of package to version"),
    ("files", [1], "its files is [1], not a mapping of file to its bytes and crc32"),
    ("files", {"__0_0.distcp": 5}, "its files entry __0_0.distcp is 5, not a mapping of file "
                                   "to its bytes and crc32"),
    ("world_size", 0, "its world_size is 0, not a whole number of ranks"),
    ("padded_vocab_size", "x", 'its padded_vocab_size is "x", not a whole number'),
    ("layout", {"tp": "x"}, 'its layout is {"tp": "x"}, not a mapping of tp, pp, vpp, cp, ep, '
                            "dp to sizes"),
    ("tokenizer", "x", 'its tokenizer is "x", not a mapping'),
    ("config", "x", "its config is \"x\", not a mapping of the run's settings"),
])
def test_a_run_json_edited_to_another_kind_of_value_is_refused(tmp_path, key, value, said):
    """Each field the pre-flight reads holds what the save writes, or the step is refused as
    damaged (not met by a check that expects a number and finds text)."""
    step = _step(tmp_path / "step_0000004", _cfg())
    manifest = json.loads((step / "run.json").read_text())
    manifest[key] = value
    (step / "run.json").write_text(json.dumps(manifest))
    assert manifest_problem(step) == (f"step_0000004/run.json cannot be read ({said}: edited "
                                       "since the save?)")


def test_a_run_json_of_an_older_save_may_lack_or_null_what_it_did_not_record(tmp_path):
    step = _step(tmp_path / "step_0000004", _cfg())
    manifest = json.loads((step / "run.json").read_text())
    for key in ("layout", "tokenizer", "config", "padded_vocab_size"):
        manifest[key] = None
    del manifest["world_size"]
    (step / "run.json").write_text(json.dumps(manifest))
    assert manifest_problem(step) is None


def test_only_this_projects_step_names_need_a_run_json(tmp_path):
    """Megatron-LM's `iter_NNNNNNN` and a checkpoint of any other name hold none by design:
    they load as before (without run checks when nothing describes them)."""
    assert manifest_problem(_step(tmp_path / "ok" / "step_0000004", _cfg())) is None
    assert is_project_step(tmp_path / "ok" / "step_0000004")
    for name in ("iter_0000004", "reference", "step_0000004.tmp-4-ab12"):
        path = dcp_step(tmp_path / "other" / name)
        assert not is_project_step(path)
    assert checkpoint_preflight(_cfg(f"checkpoint.load={tmp_path / 'other' / 'reference'}",
                                     "checkpoint.load_model_only=true")) == []


# --- 2. the distributed optimizer and plain Adam ---------------------------------------------

def test_optimizer_state_of_the_other_kind_of_optimizer_is_refused_both_ways(tmp_path):
    distributed = _cfg(recipe="tiny_dp2_distopt")
    saved_dist = _step(tmp_path / "dist" / "step_0000004", distributed)
    saved_plain = _step(tmp_path / "plain" / "step_0000004", _cfg())
    into_plain = _cfg(f"checkpoint.load={saved_dist}", "train.train_iters=6")
    assert _refusal(into_plain) == (
        f"checkpoint.load={saved_dist} cannot be loaded by this run: its optimizer state was "
        "saved by the distributed optimizer (optimizer.distributed=true) and this run uses "
        "plain Adam (optimizer.distributed=false), which cannot load it; resume with "
        "optimizer.distributed=true, or start from its weights with "
        "checkpoint.load_model_only=true (a fresh optimizer)")
    into_dist = _cfg(f"checkpoint.load={saved_plain}", "train.train_iters=6",
                     recipe="tiny_dp2_distopt")
    assert "saved by plain Adam (optimizer.distributed=false) and this run uses the " \
           "distributed optimizer" in _refusal(into_dist)
    fully = _cfg("checkpoint.optimizer_format=fully_reshardable", recipe="tiny_dp2_distopt")
    assert optimizer_kind_problem(_cfg(), {"config": config_dict(fully)})  # either format
    weights = _cfg(f"checkpoint.load={saved_dist}", "checkpoint.load_model_only=true")
    assert optimizer_kind_problem(weights, {"config": config_dict(distributed)}) is None
    assert checkpoint_preflight(weights) == []
    assert optimizer_kind_problem(_cfg(), {"config": config_dict(_cfg())}) is None



def test_a_full_resume_across_fp32_and_a_half_precision_is_refused_before_launch(tmp_path):
    """Megatron's optimizer state under bf16/fp16 holds fp32 main weights that fp32's lacks,
    and the distributed optimizer's dp_reshardable state is keyed by its buffers' dtypes: every
    rank failed in the load with a KeyError. The rest resumed (measured)."""
    saved = _step(tmp_path / "fp32" / "step_0000004", _cfg())
    assert _refusal(_cfg(f"checkpoint.load={saved}", "train.train_iters=6",
                         "precision.dtype=bf16")) == (
        f"checkpoint.load={saved} cannot be loaded by this run: its optimizer state was saved "
        "at precision.dtype=fp32 and this run's precision.dtype=bf16 keeps fp32 main copies of "
        "the weights, which Megatron's optimizer state is keyed by; resume with "
        "precision.dtype=fp32, or start from its weights with checkpoint.load_model_only=true "
        "(a fresh optimizer)")
    bf16 = {"config": config_dict(_cfg("precision.dtype=bf16"))}
    assert "this run's precision.dtype=fp32 keeps no main copies" in precision_problem(
        _cfg(), bf16)
    assert precision_problem(_cfg("precision.dtype=fp16"), bf16) is None
    dp_reshardable = {"config": config_dict(_cfg("precision.dtype=bf16",
                                                 recipe="tiny_dp2_distopt"))}
    assert precision_problem(_cfg("precision.dtype=fp16", recipe="tiny_dp2_distopt"),
                             dp_reshardable).startswith(
        "its optimizer state was saved dp_reshardable at precision.dtype=bf16, keyed by the "
        "dtypes of the distributed optimizer's buffers; resume with precision.dtype=bf16")
    fully = {"config": config_dict(_cfg("checkpoint.optimizer_format=fully_reshardable",
                                        recipe="tiny_dp2_distopt"))}
    assert precision_problem(_cfg("precision.dtype=bf16", recipe="tiny_dp2_distopt"),
                             fully) is None
    fsdp = {"config": config_dict(_cfg("precision.dtype=bf16", recipe="tiny_dp2_fsdp"))}
    assert precision_problem(_cfg("precision.dtype=fp16", recipe="tiny_dp2_fsdp"), fsdp) is None
    assert "keeps no main copies" in precision_problem(_cfg(recipe="tiny_dp2_fsdp"), fsdp)
    assert precision_problem(_cfg("precision.dtype=bf16", "checkpoint.load_model_only=true"),
                             {"config": config_dict(_cfg())}) is None

# --- 3. a Hugging Face import ------------------------------------------------------------------

def _hf_import(path: Path, recipe: str, with_run_json: bool) -> Path:
    """What scripts/convert.py import leaves: Megatron's files, the recipe's config.yaml, the
    source's hf/config.json; newer imports also a run.json (step 0, the recipe's config)."""
    cfg = get_recipe(recipe)
    _step(path, cfg if with_run_json else None, step=0)
    save_config(cfg, path / "config.yaml")
    (path / "hf").mkdir()
    (path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    return path


@pytest.mark.parametrize("with_run_json", [False, True])
def test_an_import_loads_weights_only_and_into_its_own_shape(tmp_path, with_run_json):
    out = _hf_import(tmp_path / "imported", "hf_tiny_llama", with_run_json)
    assert is_hf_import(out) and not is_hf_import(_step(tmp_path / "step_0000001", _cfg()))
    load = f"checkpoint.load={out}"
    assert _refusal(_cfg(load, recipe="hf_tiny_llama")) == (
        f"checkpoint.load={out} is a Hugging Face import (scripts/convert.py import), which "
        "holds weights only (no step, optimizer or schedule); add "
        "checkpoint.load_model_only=true")
    assert checkpoint_preflight(_cfg(load, "checkpoint.load_model_only=true",
                                     recipe="hf_tiny_llama")) == []
    other_shape = _refusal(_cfg(load, "checkpoint.load_model_only=true"))
    assert "does not fit this run's model: it was saved with model.ffn_hidden_size=128, this " \
           "run has model.ffn_hidden_size=256" in other_shape


def test_an_import_whose_config_cannot_be_read_is_named(tmp_path):
    out = _hf_import(tmp_path / "imported", "hf_tiny_llama", with_run_json=False)
    (out / "config.yaml").write_text("model: [\n")
    assert _refusal(_cfg(f"checkpoint.load={out}", "checkpoint.load_model_only=true")).startswith(
        f"checkpoint.load={out} is a Hugging Face import whose config.yaml cannot be read (")


# --- 7. a resume that would train no step ------------------------------------------------------

@pytest.mark.parametrize("iters", [2, 3])
def test_a_resume_that_would_train_no_step_is_refused(tmp_path, iters):
    step = _step(tmp_path / "checkpoints" / "step_0000004", _cfg())
    assert _refusal(_cfg(f"checkpoint.load={step}", f"train.train_iters={iters}")) == (
        f"checkpoint.load={step}: train.train_iters={iters} is before the checkpoint's step "
        "4, so this run would train no step; raise it (e.g. train.train_iters=8)")
    assert checkpoint_preflight(_cfg(f"checkpoint.load={step}", "train.train_iters=5"))
    weights = _cfg(f"checkpoint.load={step}", f"train.train_iters={iters}",
                   "checkpoint.load_model_only=true")
    assert iterations_problem(weights, 4) is None  # a new run from the weights: its own steps


def test_a_resume_at_its_last_step_is_a_finished_run_not_a_mistake(tmp_path):
    """A Slurm job requeued after its final save resumes at train.train_iters: it ends well,
    saying so, rather than failing the job."""
    step = _step(tmp_path / "checkpoints" / "step_0000004", _cfg())
    notes = checkpoint_preflight(_cfg(f"checkpoint.load={step}", "train.train_iters=4"))
    assert "the checkpoint is at step 4 = train.train_iters: the run is finished and trains " \
           "no step (raise train.train_iters to train on)" in notes


def test_a_megatron_lm_step_that_would_train_no_step_is_refused(tmp_path):
    cfg = _cfg("train.train_iters=9")
    manifest = {"writer": "Megatron-LM", "step": 10, "consumed_samples": 80,
                "layout": layout_record(cfg.layout), "padded_vocab_size": cfg.layout.padded_vocab,
                "optimizer_saved": True, "config": config_dict(cfg)}
    with pytest.raises(ConfigError, match=r"^checkpoint.load=x \(Megatron-LM's\): train.train_"
                                          r"iters=9 is before the checkpoint's step 10, "):
        foreign_preflight(cfg, "x", tmp_path, manifest)


def test_a_gpt_checkpoint_for_a_hybrid_run_is_named_by_family_not_by_a_layer_count():
    """Loading a GPT model's step into a hybrid recipe (or back) names both families and the
    saved recipe, not `model.num_layers` (whose saved value would not make a hybrid load it)."""
    from recipes.config.io import config_dict
    from recipes.registry import get_recipe
    from trainer.checkpoint.manifest import _current, flatten, shape_mismatch

    gpt, hybrid = get_recipe("tiny_dp1"), get_recipe("hybrid_tiny_dp1")
    assert shape_mismatch(flatten(config_dict(gpt)), _current(hybrid)) == (
        "it holds a GPT model and this run builds a hybrid model (model.hybrid_layer_pattern="
        f"{hybrid.model.hybrid_layer_pattern}); load it with a recipe of its family (the saved "
        "run's: tiny_dp1)")
    assert shape_mismatch(flatten(config_dict(hybrid)), _current(gpt)).startswith(
        "it holds a hybrid model (model.hybrid_layer_pattern=")

"""What a checkpoint's `run.json` lets the launching process decide, without torch or ranks:
damaged files (each kind named), a model that cannot load it (each field alone), the changes a
resume states, the data position in samples across a change of batch size, and the rule that
saves happen only between optimizer steps."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe
from trainer.checkpoint.format import MANIFEST_FILE
from trainer.checkpoint.manifest import (
    damaged_file,
    file_record,
    flatten,
    incompatibility,
    layout_record,
    resume_notes,
    shape_mismatch,
    stated_changes,
    tokenizer_identity,
    tokenizer_mismatch,
)
from trainer.checkpoint.preflight import checkpoint_preflight, previous_step


def _cfg(*overrides: str, recipe: str = "tiny_dp2"):
    return apply_overrides(get_recipe(recipe), ["data.source=synthetic", *overrides])


def _write_step(root: Path, step: int, cfg, files: dict[str, bytes]) -> Path:
    """A step directory as a save leaves it: Megatron's files and a matching run.json."""
    from recipes.config.io import config_dict

    path = root / f"step_{step:07d}"
    path.mkdir(parents=True)
    for name, data in {"metadata.json": b"{}", **files}.items():
        (path / name).write_bytes(data)
    manifest = {
        "format": 1, "step": step, "consumed_samples": 8 * step, "consumed_tokens": 1000 * step,
        "world_size": 2, "layout": layout_record(cfg.layout),
        "padded_vocab_size": cfg.layout.padded_vocab,
        "versions": {"torch": "t", "megatron-core": "m", "mcore-recipes": "p"},
        "tokenizer": tokenizer_identity(cfg), "config": config_dict(cfg),
        "files": {p.name: file_record(p) for p in path.iterdir()},
    }
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    cfg = _cfg()
    root = tmp_path / "checkpoints"
    _write_step(root, 2, cfg, {"__0_0.distcp": b"a" * 64})
    _write_step(root, 4, cfg, {"__0_0.distcp": b"b" * 64, "__1_0.distcp": b"c" * 64})
    (root / "latest").write_text("step_0000004")
    return root


def _manifest(step_dir: Path) -> dict:
    return json.loads((step_dir / MANIFEST_FILE).read_text())


def test_an_intact_checkpoint_has_no_damaged_file(root):
    step = root / "step_0000004"
    assert damaged_file(step, _manifest(step), checksums=True) is None


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda p: p.unlink(), "step_0000004/__1_0.distcp is missing"),
    (lambda p: p.write_bytes(b"c" * 10), "is truncated or changed (10 of 64 bytes)"),
    (lambda p: p.write_bytes(b"d" * 64), "is corrupted (its CRC-32 differs"),
])
def test_each_kind_of_damage_is_named(root, damage, expected):
    step = root / "step_0000004"
    damage(step / "__1_0.distcp")
    assert expected in damaged_file(step, _manifest(step), checksums=True)


def test_size_only_verification_skips_the_checksum(root):
    step = root / "step_0000004"
    (step / "__1_0.distcp").write_bytes(b"d" * 64)
    assert damaged_file(step, _manifest(step), checksums=False) is None


def test_damage_is_refused_with_the_previous_checkpoint_as_fallback(root):
    (root / "step_0000004" / "__1_0.distcp").write_bytes(b"d" * 64)
    with pytest.raises(ConfigError) as refused:
        checkpoint_preflight(_cfg(f"checkpoint.load={root}"))
    assert str(refused.value) == (
        f"checkpoint.load={root}: step_0000004/__1_0.distcp is corrupted (its CRC-32 differs "
        f"from the save's); fall back to the previous complete checkpoint with "
        f"checkpoint.load={root / 'step_0000002'} (or delete {root / 'step_0000004'}: the root "
        "then resumes from it)")
    assert previous_step(root / "step_0000002") is None


@pytest.mark.parametrize("override", [
    "model.num_layers=8", "model.hidden_size=128", "model.ffn_hidden_size=512",
    "model.num_attention_heads=8", "model.num_query_groups=2", "model.vocab_size=512",
    "model.activation=swiglu", "model.normalization=RMSNorm",
    "model.share_embeddings_and_output_weights=false", "model.add_bias_linear=false",
    "model.layernorm_zero_centered_gamma=true",  # the norms store gamma - 1 instead
])
def test_each_shape_field_alone_refuses_the_load(override):
    saved = flatten(_config(_cfg()))
    field = override.split("=")[0]
    mismatch = shape_mismatch(saved, flatten(_config(_cfg(override))))
    assert mismatch.startswith(f"it was saved with {field}=")
    shown = override.replace("false", "False").replace("true", "True")
    assert mismatch.endswith(f"this run has {shown}")


@pytest.mark.parametrize(("override", "refused"), [
    ("model.hybrid_layer_pattern=MEM*EME/*E", True),  # one MTP depth instead of two
    ("model.mtp_use_repeated_layer=false", True),  # two stored depths instead of one
    ("model.moe_latent_size=16", True),
    ("model.hybrid_layer_pattern=MEM*|EME/*E/*E", False),  # a stage cut is layout, not shape
])
def test_mtp_depths_and_the_latent_width_are_shape(override, refused):
    from recipes.config.overrides import apply_overrides
    from recipes.registry import get_recipe

    saved = flatten(_config(get_recipe("super_tiny_dp1")))
    current = flatten(_config(apply_overrides(get_recipe("super_tiny_dp1"), [override])))
    assert (shape_mismatch(saved, current) is not None) == refused


def _config(cfg) -> dict:
    from recipes.config.io import config_dict

    return config_dict(cfg)


def test_vocabulary_padding_and_tokenizer_changes_are_refused(root):
    manifest = _manifest(root / "step_0000004")
    padded = incompatibility(_cfg("model.make_vocab_size_divisible_by=512"), manifest)
    assert padded.startswith("its vocabulary is padded to 256 rows, this run pads to 512")
    web = {"kind": "prepared", "vocab_size": 4096, "eod_id": 0, "files_crc32": [7],
           "folders": ["/data/web.tokenizer"]}
    assert tokenizer_mismatch({"kind": "byte"}, web) == (
        "it was trained with the byte tokenizer of the built-in corpora, this run's data uses "
        "tokenizer /data/web.tokenizer (vocab 4096, EOD 0); set data.source back to the saved "
        "run's, or train from scratch without checkpoint.load")
    code = {**web, "files_crc32": [8], "folders": ["/data/code.tokenizer"]}
    assert tokenizer_mismatch(web, code, "conf/data/web.yaml") == (
        "it was trained with tokenizer /data/web.tokenizer (vocab 4096, EOD 0), this run's data "
        "uses tokenizer /data/code.tokenizer (vocab 4096, EOD 0); set data.blend back to a "
        "blend prepared with the saved tokenizer (the saved run had data.blend="
        "conf/data/web.yaml), or train from scratch without checkpoint.load")
    # the same files elsewhere, and a checkpoint saved before folders were recorded: no word
    assert tokenizer_mismatch(web, {**web, "folders": ["/moved/web.tokenizer"]}) is None
    older = {key: value for key, value in web.items() if key != "folders"}
    assert tokenizer_mismatch(older, web) is None
    assert "a prepared tokenizer (vocab 4096, EOD 0, tokenizer.json CRC-32 [7])" in \
        tokenizer_mismatch(older, code)
    assert incompatibility(_cfg("train.global_batch_size=16"), manifest) is None


def test_a_resume_states_what_it_continues_from_and_what_changed(root):
    cfg = _cfg(f"checkpoint.load={root}", "train.global_batch_size=16", "optimizer.lr=0.001",
               "parallel.tensor=2")
    notes = resume_notes(cfg, root / "step_0000004", _manifest(root / "step_0000004"))
    assert notes[0].startswith(f"resuming from {root / 'step_0000004'} (step 4, 32 samples, "
                               "4000 loss tokens; saved by mcore-recipes p, torch t")
    assert notes[1].startswith("changed since the save: train.global_batch_size 8 -> 16, "
                               "optimizer.lr 0.003 -> 0.001; this run's values apply")
    assert notes[2].startswith("layout DP2 (2 ranks) -> TP2 (2 ranks): weights and optimizer")
    assert stated_changes(flatten(_config(cfg)), flatten(_config(cfg))) == []


def test_weights_only_start_states_nothing(root):
    cfg = _cfg(f"checkpoint.load={root}", "checkpoint.load_model_only=true",
               "optimizer.lr=0.001")
    assert checkpoint_preflight(cfg) == []


def test_data_position_in_samples_survives_a_change_of_global_batch():
    from trainer.data import GlobalBatches, in_memory_sources

    cfg8 = _cfg("data.max_corpus_bytes=60000", recipe="tiny_dp1")
    cfg16 = _cfg("data.max_corpus_bytes=60000", "train.global_batch_size=16", recipe="tiny_dp1")
    source, _ = in_memory_sources(cfg8)
    eight = GlobalBatches(source, cfg8, 0)
    taken = np.concatenate([eight.global_batch_indices(s) for s in range(4)])
    for _ in range(2):
        eight.take()
    sixteen = GlobalBatches(source, cfg16, 0)
    sixteen.load_state_dict(eight.state_dict())
    assert eight.state_dict() == {"next_sample": 16}
    rows = np.concatenate([mb["tokens"].numpy() for mb in sixteen.take()])
    assert np.array_equal(rows, source.samples[taken[16:32]][:, :-1])
    assert sixteen.state_dict() == {"next_sample": 32}


def test_a_save_inside_an_optimizer_step_is_refused():
    from trainer.checkpoint.save import save_checkpoint

    with pytest.raises(RuntimeError, match="inside an optimizer step"):
        save_checkpoint(SimpleNamespace(mid_step=True), "unused")


def test_a_dp_reshardable_optimizer_state_resumes_across_dp_only(tmp_path):
    """dp_reshardable (the default) stores each DP rank's slice of the optimizer's buffers,
    laid out by the TP/PP split: another DP size resumes; another TP or PP is refused before
    launch with the three ways out; fully_reshardable and weights-only loads go anywhere."""
    saved = _cfg("optimizer.distributed=true", recipe="tiny_tp2")
    assert saved.checkpoint.optimizer_format == "dp_reshardable"
    root = tmp_path / "checkpoints"
    _write_step(root, 2, saved, {"__0_0.distcp": b"a"})
    load = f"checkpoint.load={root}"
    wider = _cfg("optimizer.distributed=true", "cluster.gpus_per_node=4", load,
                 recipe="tiny_tp2")
    assert wider.layout.data_parallel == 2 and checkpoint_preflight(wider)
    other_tp = _cfg("optimizer.distributed=true", load, recipe="tiny_dp2")
    with pytest.raises(ConfigError) as caught:
        checkpoint_preflight(other_tp)
    assert str(caught.value) == (
        f"checkpoint.load={root} cannot resume in this layout: its optimizer state was saved "
        "dp_reshardable at TP2, which reshards over DP only, and this run changes TP (DP2); "
        "resume at the saved layout, or start from its weights with "
        "checkpoint.load_model_only=true (a fresh optimizer), or save with "
        "checkpoint.optimizer_format=fully_reshardable to move between layouts")
    assert checkpoint_preflight(_cfg("optimizer.distributed=true", load,
                                     "checkpoint.load_model_only=true", recipe="tiny_dp2")) == []
    fully = tmp_path / "fully"
    _write_step(fully, 2, _cfg("optimizer.distributed=true",
                               "checkpoint.optimizer_format=fully_reshardable",
                               recipe="tiny_tp2"), {"__0_0.distcp": b"a"})
    assert checkpoint_preflight(_cfg("optimizer.distributed=true", f"checkpoint.load={fully}",
                                     recipe="tiny_dp2"))


def test_experts_moving_between_the_dense_and_their_own_optimizer_are_refused(tmp_path):
    """At TP2 + SP with EP1 the experts sit in the dense model's optimizer; at EP2 they have
    their own: Megatron's chained optimizer cannot load one as the other, in any format."""
    fully = ["optimizer.distributed=true", "checkpoint.optimizer_format=fully_reshardable"]
    root = tmp_path / "checkpoints"
    _write_step(root, 2, _cfg(*fully, recipe="hybrid_tiny_tp2_sp"), {"__0_0.distcp": b"a"})
    load = f"checkpoint.load={root}"
    with pytest.raises(ConfigError) as caught:
        checkpoint_preflight(_cfg(*fully, load, recipe="hybrid_tiny_ep2_dp2"))
    assert str(caught.value) == (
        f"checkpoint.load={root} cannot resume in this layout: its experts' optimizer state was "
        "saved in the dense model's optimizer (EP1, expert-TP = TP) and this run keeps them in "
        "an optimizer of their own (EP > 1 or expert-TP != TP), which Megatron's chained "
        "optimizer cannot load; resume with EP1 and expert-TP = TP, or start from its weights "
        "with checkpoint.load_model_only=true (a fresh optimizer)")
    assert checkpoint_preflight(_cfg(*fully, load, recipe="hybrid_tiny_pp2_vpp2"))
    assert checkpoint_preflight(_cfg(*fully, load, "checkpoint.load_model_only=true",
                                     recipe="hybrid_tiny_ep2_dp2")) == []


def test_a_megatron_fsdp_checkpoint_of_mamba_layers_loads_at_its_own_tp_only():
    """fsdp_dtensor keeps each Mamba in_proj and conv1d as the TP ranks' parts end to end: at
    another TP they cannot be cut right, weights alone included; the same TP, or a GPT, loads."""
    from recipes.config.io import config_dict
    from trainer.checkpoint.manifest import reshard_problem

    def manifest(recipe: str, *overrides: str) -> dict:
        return {"config": config_dict(apply_overrides(get_recipe(recipe), list(overrides)))}

    saved = manifest("hybrid_tiny_tp2_sp", "optimizer.fsdp=optim_grads_params",
                     "optimizer.distributed=true")
    for load in ([], ["checkpoint.load_model_only=true"]):
        at_tp1 = apply_overrides(get_recipe("hybrid_tiny_dp1"), load)
        assert reshard_problem(at_tp1, saved).startswith(
            "its Mamba layers were saved by Megatron FSDP at TP2, each in_proj and conv1d as "
            "every TP rank's parts end to end, which cannot be cut for TP1; resume with "
            "parallel.tensor=2")
    fsdp = ["optimizer.fsdp=optim_grads_params", "optimizer.distributed=true"]
    same_tp = apply_overrides(get_recipe("hybrid_tiny_tp2_sp"), fsdp)
    assert reshard_problem(same_tp, saved) is None
    gpt = manifest("tiny_tp2_pp2", "optimizer.fsdp=optim_grads_params", "parallel.pipeline=1",
                   "cluster.gpus_per_node=2", "optimizer.distributed=true")
    assert reshard_problem(apply_overrides(get_recipe("tiny_dp1"), []), gpt) is None


def test_decay_iterations_left_unset_are_not_a_change_of_their_own():
    """Unset decay iterations follow train_iters: a longer run states train_iters alone (not
    `scheduler.decay_iters None -> None`); decay iterations set to another value are stated
    with the values the schedule uses, and set to what they followed, not at all."""
    saved = flatten(_config(_cfg("train.train_iters=4")))
    longer = flatten(_config(_cfg("train.train_iters=6")))
    assert stated_changes(saved, longer) == ["train.train_iters 4 -> 6"]
    set_now = flatten(_config(_cfg("train.train_iters=6", "scheduler.decay_iters=5")))
    assert stated_changes(saved, set_now) == ["train.train_iters 4 -> 6",
                                              "scheduler.decay_iters 4 -> 5"]
    same = flatten(_config(_cfg("train.train_iters=4", "scheduler.decay_iters=4")))
    assert stated_changes(saved, same) == []


def test_a_resume_into_another_attention_softmax_precision_is_stated():
    """A Nemotron checkpoint trained with the softmax in bf16, resumed by a recipe that keeps it
    in fp32 (or the other way): the numerics change, so the change is said before launch."""
    saved = flatten(_config(_cfg("model.attention_softmax_in_fp32=false")))
    now = flatten(_config(_cfg()))
    assert stated_changes(saved, now) == ["model.attention_softmax_in_fp32 false -> true"]


def test_a_run_saved_before_the_softmax_field_resumes_stating_what_it_trained_with():
    """Runs saved before `model.attention_softmax_in_fp32` existed trained with it on: a
    recipe that turns it off states the change; one that keeps it states nothing."""
    saved = {key: value for key, value in flatten(_config(_cfg())).items()
             if key != "model.attention_softmax_in_fp32"}
    off = flatten(_config(_cfg("model.attention_softmax_in_fp32=false")))
    assert stated_changes(saved, off) == ["model.attention_softmax_in_fp32 true -> false"]
    assert stated_changes(saved, flatten(_config(_cfg()))) == []


def test_a_packed_run_saved_before_the_pack_order_field_states_the_order_it_leaves():
    """Packed runs saved before `data.pack_order` existed took their rows in the v1 order: a
    resume in Megatron's order says so (the way back is data.pack_order=v1); one that keeps v1
    says nothing, and nor does a run without packed rows, which reads no pack order."""
    packed = {**flatten(_config(_cfg())), "data.documents": "packed"}
    saved = {key: value for key, value in packed.items() if key != "data.pack_order"}
    assert stated_changes(saved, packed) == ["data.pack_order v1 -> megatron"]
    assert stated_changes(saved, {**packed, "data.pack_order": "v1"}) == []
    unpacked = flatten(_config(_cfg()))
    assert stated_changes({k: v for k, v in unpacked.items() if k != "data.pack_order"},
                          unpacked) == []


def test_a_resume_into_another_end_of_document_loss_mask_is_stated():
    saved = flatten(_config(_cfg()))
    unmasked = flatten(_config(_cfg("data.eod_mask_loss=false")))
    assert stated_changes(saved, unmasked) == ["data.eod_mask_loss true -> false"]

"""Hugging Face interop, exact: tiny random-weight Llama-, Mixtral- and NemotronH-shaped models
from `transformers` are imported, run in our trainer, loaded into other layouts, and exported back.
NemotronH (Mamba2, attention, MLP and MoE blocks) runs in transformers' own PyTorch path: an
implementation of the Mamba mixer and the Nemotron 3 router nobody here wrote.

- import -> one forward pass in our trainer on one rank gives transformers' logits (fp32), and
  zero logits on the padded vocabulary rows;
- export -> `from_pretrained` gives the same logits, and every tensor is byte-identical to the
  original (names, dtype, bytes);
- the imported checkpoint loaded at TP2 x PP2, PP2 x VPP2 (Llama), EP2 (Mixtral), TP2 + SP and
  EP2 (NemotronH, Nemotron 3 Super-shaped) gives transformers' loss, and what those layouts save
  exports byte-identical again; the NemotronH layouts then train a few steps.

The Nemotron 3 Super-shaped model (latent MoE, one stored MTP depth Megatron runs twice) carries
a release's `mtp.*` tensors beside transformers' own: transformers computes no MTP head (it skips
them on load), so the logits compared are the main head's; the MTP depth's tensors go through
the import, every layout and the export byte-identical.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.hf_runs import VOCABS, make_hf_model

PADDED = 320
# fp32, a different summation order than transformers' (NemotronH: also its own chunked scan;
# below the 2.5e-5 by which transformers' dt clamp at time_step_min=0.001 moves its logits).
TOLERANCE = {"llama": 2e-5, "mixtral": 2e-5, "nemotron_h": 1e-5, "nemotron_super": 1e-5}
RECIPE = {"llama": "hf_tiny_llama", "mixtral": "hf_tiny_mixtral",
          "nemotron_h": "hf_tiny_nemotron_h", "nemotron_super": "hf_tiny_nemotron_super"}


def _rows(kind: str, count: int = 4, length: int = 33) -> torch.Tensor:
    return torch.randint(0, VOCABS[kind], (count, length),
                         generator=torch.Generator().manual_seed(7))


def _hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return model(tokens).logits


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    found = {}
    for shard in sorted(directory.glob("*.safetensors")):
        found.update(load_file(shard))
    return found


def _assert_byte_identical(original: Path, exported: Path) -> None:
    a, b = _tensors(original), _tensors(exported)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert a[name].contiguous().view(torch.uint8).equal(b[name].contiguous().view(torch.uint8))


@pytest.fixture(scope="module")
def imported(launch_ranks, tmp_path_factory) -> dict:
    """Each tiny model, saved by transformers and imported once for its one-rank recipe."""
    made = {}
    for kind, recipe in RECIPE.items():
        root = tmp_path_factory.mktemp(kind)
        hf = make_hf_model(kind, root / "hf")
        out = root / "imported"
        (stats,) = launch_ranks(1, "tests.dist.hf_runs:import_checkpoint",
                                {"recipe": recipe, "hf": str(hf), "out": str(out)})
        made[kind] = {"hf": hf, "checkpoint": out, "stats": stats}
    return made


@pytest.mark.parametrize("kind", list(RECIPE))
def test_import_gives_transformers_logits_and_export_round_trips(
    kind, imported, launch_ranks, tmp_path
) -> None:
    case, vocab = imported[kind], VOCABS[kind]
    tokens = _rows(kind, 2, 32)
    (ours,) = launch_ranks(1, "tests.dist.hf_runs:logits", {
        "recipe": RECIPE[kind], "checkpoint": str(case["checkpoint"]), "run_dir": str(tmp_path),
        "tokens": tokens.tolist()})
    ours = torch.tensor(ours)
    reference = _hf_logits(case["hf"], tokens)
    assert ours.shape == (2, 32, PADDED)
    assert (ours[..., :vocab] - reference).abs().max().item() < TOLERANCE[kind]
    assert torch.count_nonzero(ours[..., vocab:]) == 0  # padding rows are zero: logits 0
    exported = tmp_path / "exported"
    (export,) = launch_ranks(1, "tests.dist.hf_runs:export_checkpoint",
                             {"checkpoint": str(case["checkpoint"]), "out": str(exported)})
    _assert_byte_identical(case["hf"], exported)
    assert torch.equal(_hf_logits(exported, tokens), reference)
    imported_stats = case["stats"]
    print(f"\n{kind}: max |logit diff| {(ours[..., :vocab] - reference).abs().max().item():.2e}; "
          f"import {imported_stats['seconds']:.1f} s, peak RSS "
          f"{imported_stats['peak_rss'] / 2**20:.0f} MiB; export {export['seconds']:.1f} s, "
          f"peak RSS {export['peak_rss'] / 2**20:.0f} MiB (rank processes, libraries included)")


def _padded_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """transformers' logits with Megatron's zero logits on the padded vocabulary appended."""
    padded = torch.cat([logits, logits.new_zeros((*logits.shape[:-1],
                                                   PADDED - logits.shape[-1]))], -1)
    return torch.nn.functional.cross_entropy(padded.reshape(-1, PADDED), labels.reshape(-1)).item()


LAYOUTS = {
    "llama_tp2_pp2": ("llama", 4, ["parallel.tensor=2", "parallel.pipeline=2"]),
    "llama_pp2_vpp2": ("llama", 2, ["parallel.pipeline=2", "parallel.virtual_pipeline=2"]),
    "mixtral_ep2": ("mixtral", 2, ["parallel.expert=2"]),
    # The Mamba mixer's in_proj and conv1d split per part over TP; MoE with TP needs SP.
    "nemotron_h_tp2_sp": ("nemotron_h", 2, ["parallel.tensor=2",
                                            "parallel.sequence_parallel=true"]),
    "nemotron_h_ep2": ("nemotron_h", 2, ["parallel.expert=2"]),
    # Nemotron 3 Super's shape: latent experts, the MTP depth on both TP ranks / over EP.
    "nemotron_super_tp2_sp": ("nemotron_super", 2, ["parallel.tensor=2",
                                                    "parallel.sequence_parallel=true"]),
    "nemotron_super_ep2": ("nemotron_super", 2, ["parallel.expert=2"]),
}
TRAIN_STEPS = {"nemotron_h": 3, "nemotron_super": 5}
SHARD_BYTES = {"nemotron_h": 50_000, "nemotron_super": 50_000}  # several shards per model


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_any_layout_loads_the_import_and_exports_byte_identical(
    layout, imported, launch_ranks, tmp_path
) -> None:
    kind, ranks, parallel = LAYOUTS[layout]
    case, rows = imported[kind], _rows(kind)
    saved = tmp_path / "saved"
    results = launch_ranks(ranks, "tests.dist.hf_runs:layout_loss_and_save", {
        "recipe": RECIPE[kind], "checkpoint": str(case["checkpoint"]), "run_dir": str(tmp_path),
        "rows": rows.tolist(), "save_dir": str(saved), "train_steps": TRAIN_STEPS.get(kind, 0),
        "overrides": [*parallel, f"cluster.gpus_per_node={ranks}"]})
    reference = _padded_loss(_hf_logits(case["hf"], rows[:, :-1]), rows[:, 1:])
    for result in results:
        assert result["loss"] == pytest.approx(reference, rel=1e-5)
        # It trains on from the import: the loss falls to its lowest at the last step (each
        # step's batch is another, so a step may rise on a harder batch).
        trained = result["train_losses"]
        assert len(trained) == TRAIN_STEPS.get(kind, 0)
        assert all(map(math.isfinite, trained))
        assert not trained or trained[-1] < min(trained[:-1])
    exported = tmp_path / "exported"
    # Small shards: the export writes several and an index, as for a published model.
    launch_ranks(1, "tests.dist.hf_runs:export_checkpoint",
                 {"checkpoint": str(saved), "out": str(exported),
                  "max_shard_bytes": SHARD_BYTES.get(kind, 200_000)})
    assert (exported / "model.safetensors.index.json").is_file()
    _assert_byte_identical(case["hf"], exported)
    # The layout's run started from the import: the source's side files come back with it.
    assert (exported / "generation_config.json").is_file()


PUBLISHED_RECIPES = ["llama3_8b_tp8_dp8", "llama3_70b_tp4_pp4_cp2_vpp5_dp2",
                     "mixtral_8x7b_tp1_pp4_ep8_dp16"]


# Megatron FSDP runs from the import, one step, saved fsdp_dtensor. The step's lr is the warm-up's
# first, 0 (init_lr), so the weights are the import's; the expert bias, updated beside the
# optimizer, is held still too. Megatron FSDP splits the fused SwiGLU fc1 (Llama) into two
# tensors, numbers experts globally (EP2) and stores Mamba's in_proj and conv1d whole, which at
# TP2 is the two ranks' [z; x; B; C; dt] end to end.
FSDP = ["optimizer.distributed=true", "optimizer.fsdp=optim_grads_params"]
FSDP_LAYOUTS = {
    "llama_dp2_zero3": ("llama", 2, FSDP),
    "nemotron_h_ep2_zero2": ("nemotron_h", 2, ["optimizer.distributed=true",
                                               "optimizer.fsdp=optim_grads",
                                               "parallel.expert=2"]),
    "nemotron_h_tp2_sp_zero3": ("nemotron_h", 2, [*FSDP, "parallel.tensor=2",
                                                  "parallel.sequence_parallel=true"]),
}


@pytest.mark.parametrize("layout", list(FSDP_LAYOUTS))
def test_a_megatron_fsdp_checkpoint_exports_byte_identical(
    layout, imported, launch_ranks, tmp_path
) -> None:
    kind, ranks, overrides = FSDP_LAYOUTS[layout]
    case = imported[kind]
    results = launch_ranks(ranks, "tests.dist.hf_runs:train_and_save", {
        "recipe": RECIPE[kind], "checkpoint": str(case["checkpoint"]), "run_dir": str(tmp_path),
        "steps": 1, "overrides": [f"cluster.gpus_per_node={ranks}",
                                  "model.moe_router_bias_update_rate=0", *overrides]})
    assert [r["lrs"] for r in results] == [[0.0]] * ranks
    from trainer.checkpoint.format import checkpoint_backend

    assert checkpoint_backend(Path(results[0]["step"])) == "fsdp_dtensor"
    exported = tmp_path / "exported"
    (export,) = launch_ranks(1, "tests.dist.hf_runs:export_checkpoint",
                             {"checkpoint": str(tmp_path / "checkpoints"), "out": str(exported)})
    _assert_byte_identical(case["hf"], exported)
    print(f"\n{layout}: fsdp_dtensor export {export['seconds']:.1f} s, peak RSS "
          f"{export['peak_rss'] / 2**20:.0f} MiB")
    if layout == "llama_dp2_zero3":  # a rank's shard file cut short: one line, no output
        damaged = tmp_path / "damaged"
        shutil.copytree(results[0]["step"], damaged)
        shard = damaged / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
        # The step's run.json names it first, before torch (trainer/interop/export_step.py) ...
        from plugins.protocol.errors import ConfigError
        from trainer.interop.export_step import checked_step

        with pytest.raises(ConfigError, match=r"damaged/__1_0\.distcp is truncated or changed"):
            checked_step(damaged)
        # ... and without one (a step of another tool), the sizes its DCP index places, still
        # before torch (`megatron_lm.unchecked_damage`, as pretrain.py's pre-flight).
        (damaged / "run.json").unlink()
        (error,) = launch_ranks(1, "tests.dist.hf_runs:export_error",
                                {"checkpoint": str(damaged), "out": str(tmp_path / "none")})
        assert "damaged/__1_0.distcp is cut short (" in error and "\n" not in error
        assert not (tmp_path / "none").exists()


def test_published_shapes_import_to_exactly_our_recipes_models(launch_ranks) -> None:
    """Llama-3-8B, Llama-3-70B, Mixtral-8x7B: the names and shapes the import writes are the
    recipe's real model's, built on the meta device (tests/unit/test_hf_mapping.py checks the
    Hugging Face side: published configs and parameter counts)."""
    (found,) = launch_ranks(1, "tests.dist.hf_runs:published_shapes",
                            {"recipes": PUBLISHED_RECIPES})
    for recipe in PUBLISHED_RECIPES:
        assert found[recipe]["imported"] == found[recipe]["model"], recipe
    assert found["llama3_8b_tp8_dp8"]["model"]["embedding.word_embeddings.weight"] == [
        129024, 4096]  # 128,256 padded to a multiple of 128 x TP8
    # embedding, final norm, output + per layer: 2 norms, qkv, proj, router, 8 x (fc1, fc2)
    assert len(found["mixtral_8x7b_tp1_pp4_ep8_dp16"]["model"]) == 3 + 32 * (5 + 8 * 2)

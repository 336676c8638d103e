"""Every setting of every Nemotron recipe has a source, beside its value.

For each `nemotron*` recipe of the registry: it is a sourced recipe (`recipes/sources.py`),
every training setting (shape, batch, sequence, schedule, run length, optimizer, init,
precision and FP8, MoE routing, phases) and every field it changes from the schema's defaults
is in its table with a source, and the table holds the values the recipe trains with. A source
is of a known kind, names where it comes from (code as owner/repo@commit:path:line), and a
difference or a choice of our own says why. The check itself is shown to fail on a setting
without a source and on a value changed after the table; `docs/nemotron.md` must be what
`scripts/nemotron_table.py` writes from the recipes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recipes.config.phases import phase_config, phase_spans
from recipes.config.validation import check_documents_keep_eod_mask
from recipes.nemotron.page import nemotron_page
from recipes.registry import RECIPES
from recipes.sources import (
    KINDS,
    build,
    ours,
    published,
    settings_of,
    sourced_recipe,
    unsourced,
)

REPO = Path(__file__).resolve().parents[2]
NEMOTRON = [name for name in RECIPES if name.startswith("nemotron")]
# owner/repo@commit:path[:lines], or the installed Megatron Core's path.
CODE = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40}:[\w./-]+\.(py|yaml|md|json)(:[\d, -]+)?"
                  r"|megatron-core \d+\.\d+\.\d+:megatron/core/[\w./]+\.py:\d+")


def test_the_catalogue_has_the_nemotron_recipes() -> None:
    assert len(NEMOTRON) == 13
    assert all(settings_of(RECIPES[name]) is not None for name in NEMOTRON)


@pytest.mark.parametrize("name", NEMOTRON)
def test_every_setting_has_a_source(name) -> None:
    assert unsourced(RECIPES[name]) == []


@pytest.mark.parametrize("name", NEMOTRON)
def test_every_source_says_where_and_why(name) -> None:
    for key, setting in settings_of(RECIPES[name]).items():
        source = setting.source
        assert source.kind in KINDS, key
        assert source.where.strip(), key
        if source.kind in ("differs", "ours"):
            assert source.note.strip(), f"{key}: a difference or a choice says why"
        if "@" in source.where or "megatron-core" in source.where:
            assert CODE.search(source.where), f"{key}: {source.where}"


@pytest.mark.parametrize("name", NEMOTRON)
def test_every_phase_keeps_the_loss_mask_its_rows_need(name) -> None:
    """Bridge keeps the loss on the token after each end-of-document, and the recipes follow
    it; a phase whose rows pack whole documents must mask it (no label crosses a document),
    which its relaunch is validated for: such a recipe keeps the mask and says it differs."""
    cfg = RECIPES[name]()
    for span in phase_spans(cfg):
        assert check_documents_keep_eod_mask(phase_config(cfg, span)) is None, span.name


def test_a_setting_without_a_source_fails() -> None:
    table = {"train.global_batch_size": published(64, "a report, Table 1")}

    @sourced_recipe
    def half_sourced():
        return table

    missing = unsourced(half_sourced)
    assert "train.global_batch_size" not in missing
    assert {"optimizer.lr", "train.train_iters", "model.init_method_std"} <= set(missing)


def test_a_value_changed_after_its_table_fails() -> None:
    table = {"optimizer.lr": ours(1e-3, "an example")}

    def changed():
        cfg = build(table)
        cfg.optimizer.lr = 2e-3
        return cfg

    changed.settings = lambda: table
    assert any(line.startswith("optimizer.lr (the table says 0.001, the recipe trains 0.002)")
               for line in unsourced(changed))


def test_the_gpu_checks_train_the_recipes_fp8_presets() -> None:
    """The FP8 plugin's Nemotron GPU checks are the recipes' presets (written in the recipes
    with their sources; the plugin cannot import the catalogue)."""
    from plugins.fp8.config import Fp8Config

    checks = Fp8Config().gpu_checks()
    for check, recipe in (("nemotron_h_fp8_hybrid", "nemotron_h_56b_tp8_sp_dp8"),
                          ("nano_v2_fp8_blockwise_hybrid", "nemotron_nano_v2_12b_tp4_sp_dp16")):
        table = settings_of(RECIPES[recipe])
        preset = {key: setting.value for key, setting in table.items()
                  if key.startswith("plugins.fp8.")}
        overrides = dict(o.split("=", 1) for o in checks[check])
        assert overrides.pop("optimizer.distributed") == "true"
        assert {k: v.lower() for k, v in overrides.items()} == {
            k: str(v).lower() for k, v in preset.items()}


def test_the_gpu_check_trains_supers_nvfp4_preset() -> None:
    """Nemotron 3 Super's NVFP4 preset (its recipe names it; 80-GB H100s cannot run it) is the
    GPU check's `_super` NVFP4 run, the BF16 end layers scaled to the check's 7-layer model."""
    from plugins.fp8.config import Fp8Config
    from recipes.nemotron.nemotron3_super import SUPER_NVFP4

    checked = dict(o.split("=", 1) for o in Fp8Config().gpu_checks()["nemotron_super_nvfp4_super"])
    preset = dict(o.split("=", 1) for o in SUPER_NVFP4)
    assert (checked.pop("plugins.fp8.last_layers_bf16"),
            preset.pop("plugins.fp8.last_layers_bf16")) == ("1", "14")
    assert checked == preset
    table = settings_of(RECIPES["nemotron3_super_120b_a12b_tp4_sp_ep64_dp16"])
    assert " ".join(SUPER_NVFP4) in table["plugins.fp8.format"].source.note


def test_the_docs_page_is_generated_from_the_recipes() -> None:
    committed = (REPO / "docs" / "nemotron.md").read_text(encoding="utf-8")
    assert committed == nemotron_page(), (
        "docs/nemotron.md is stale: run python scripts/nemotron_table.py out=docs/nemotron.md")
    assert all(f"## `{name}`" in committed for name in NEMOTRON)

"""The one table of patches to Megatron (`trainer/megatron_patches.py`) against its homes and
its self-tests: every patch a home applies is in the table once, every entry cites the Megatron
file:line it works around and says why in one line, and its self-test file exists and names it
(each home's own tests then show it passing with the patch and failing without)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer.checkpoint.megatron_fixes import FIX_NAMES
from trainer.cpu_runtime import megatron_lm
from trainer.cpu_runtime.runtime import PATCH_NAMES
from trainer.gpu_fast_paths import PATCH_NAMES as GPU_PATCH_NAMES
from trainer.megatron_patches import registry
from trainer.patch import Patch
from trainer.step_fixes import PATCH_NAMES as STEP_PATCH_NAMES

REPO = Path(__file__).resolve().parents[2]
TABLE = registry()


def test_the_table_holds_every_patch_each_home_applies_once():
    homes = [*PATCH_NAMES, *megatron_lm.PATCH_NAMES, *FIX_NAMES, *GPU_PATCH_NAMES,
             *STEP_PATCH_NAMES]
    assert len(homes) == len(set(homes))
    assert set(TABLE) == set(homes)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_patch_cites_megatron_says_why_and_has_a_self_test(name):
    patch = TABLE[name]
    assert re.search(r"\.py:\d+", patch.works_around), patch.works_around
    assert patch.why and "\n" not in patch.why
    test_file = REPO / patch.self_test
    assert test_file.is_file(), patch.self_test
    assert name in test_file.read_text(encoding="utf-8"), f"{patch.self_test} never names {name}"


def test_two_patches_of_one_name_are_refused(monkeypatch):
    from trainer import megatron_patches

    twice = (*megatron_patches.CPU_RUNTIME_PATCHES, Patch("rng", "x.py:1", "again", "tests"))
    monkeypatch.setattr(megatron_patches, "CPU_RUNTIME_PATCHES", twice)
    with pytest.raises(ValueError, match="two patches are named rng"):
        registry()

"""The plan's text uses one size formatter (`fit.size_text`) so a tiny recipe reads in kB/MB
and the columns line up; a one-rank layout says it sends nothing instead of an empty header;
tiny step times and GPU-hours keep their digits ('<0.01', ms), and one step is '1 step'."""

from __future__ import annotations

import pytest

from recipes.plan.build import make_plan
from recipes.plan.cluster import load_cluster, recipe_cluster
from recipes.plan.report import (
    cell_text,
    duration_text,
    hours_text,
    milliseconds_text,
    plural,
    text_report,
)
from recipes.resolve import resolve_config


@pytest.mark.parametrize(("seconds", "text"), [(12.3456, "12.35 s"), (0.0123, "0.01 s"),
                                               (5.63e-5, "0.0563 ms"), (0.0, "0.00 s")])
def test_a_tiny_step_time_keeps_its_digits(seconds, text) -> None:
    assert duration_text(seconds) == text


@pytest.mark.parametrize(("hours", "text"), [(563464.4, "563,464"), (12.34, "12.3"),
                                             (0.0456, "0.0456"), (3e-9, "<0.01"),
                                             (1.528e19, "1.53e+19")])
def test_gpu_hours_are_never_a_bare_zero(hours, text) -> None:
    assert hours_text(hours) == text


@pytest.mark.parametrize(("ms", "text"), [(0.4, "0.4"), (12.34, "12.3"), (0.052, "0.052"),
                                          (0.0, "0.0")])
def test_a_small_message_time_is_not_zero(ms, text) -> None:
    assert milliseconds_text(ms / 1e3) == text


def test_one_step_is_singular() -> None:
    assert (plural(1, "step"), plural(2, "step"), plural(1000, "token")) == (
        "1 step", "2 steps", "1,000 tokens")


def test_nothing_held_is_zero_in_the_table() -> None:
    assert (cell_text(0), cell_text(4.61e6)) == ("0", "4.61 MB")


def _report(*words: str, cluster: str | None = None) -> list[str]:
    cfg = resolve_config(list(words))
    spec = load_cluster(cluster) if cluster else recipe_cluster(cfg)
    return text_report(make_plan(cfg, spec)).splitlines()


def test_a_one_rank_layout_says_it_sends_nothing() -> None:
    lines = _report("recipe=tiny_dp1")
    at = next(i for i, line in enumerate(lines) if line.startswith("communication"))
    assert lines[at] == ("communication per optimizer step, one rank of stage 0: none (it "
                         "shares no group with another rank)")
    assert lines[at + 1].startswith("bubble:")


def test_a_tiny_plan_reads_in_one_unit_system_with_aligned_columns() -> None:
    lines = _report("recipe=tiny_tp2_pp2", cluster="conf/cluster/cpu_local.yaml")
    assert "worst rank: stage 0, peak 4.61 MB of 4.00 GB: fits" in lines
    table = [line for line in lines if line.startswith(("stage ", "    0  ", "    1  "))]
    assert len(table) == 3 and len({len(row.split("(")[0]) for row in table}) == 1
    assert "peak" in table[0] and "GB" not in table[0]
    assert table[1].split()[-2:] == ["MB", "(2)"] and " 0.00" not in "\n".join(lines)


def test_a_large_plan_keeps_gb_with_two_decimals() -> None:
    lines = _report("recipe=llama3_8b_tp8_pp4_dp2", cluster="conf/cluster/h100_80gb_8x8.yaml")
    assert any(line.startswith("worst rank: stage ") and " GB of 80.00 GB: " in line
               for line in lines)

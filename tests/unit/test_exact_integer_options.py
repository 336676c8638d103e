"""An integer option is read exactly: `tokens=1e30` is 10**30 (not the float's
1,000,000,000,000,000,019,884,624,838,656), `tokens=1.5` is refused as no whole number, and
the steps a budget takes are counted in integers."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.arguments import MAX_INTEGER_DIGITS, convert, exact_integer
from recipes.plan.batch import batch_plan, ceil_div
from recipes.registry import get_recipe


@pytest.mark.parametrize(("text", "value"), [
    ("1e30", 10**30), ("15e12", 15 * 10**12), ("1_000", 1000), ("1.5e3", 1500), ("100.0", 100),
    ("-3", -3),
])
def test_whole_numbers_are_exact(text, value) -> None:
    assert exact_integer(text) == value


@pytest.mark.parametrize("text", ["1.5", "1e-3", "nan", "inf", "abc", "0x10",
                                  f"1e{MAX_INTEGER_DIGITS}", "9" * (MAX_INTEGER_DIGITS + 1)])
def test_fractions_non_numbers_and_huge_ones_are_not_integers(text) -> None:
    assert exact_integer(text) is None


def test_a_fraction_for_an_integer_option_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^tokens expects an integer or null, got '1.5'; "):
        convert("tokens", "1.5", int | None, "tokens=15e12")


def test_ceil_div_is_exact_beyond_a_floats_digits() -> None:
    assert ceil_div(10**30 + 1, 1024) == 10**30 // 1024 + 1


def test_a_budget_of_1e30_tokens_takes_exact_steps() -> None:
    cfg = get_recipe("tiny_dp1")
    plan = batch_plan(cfg, 989.0, 0.4, 10**30)
    assert plan.steps == -(-10**30 // plan.tokens_per_step)


@pytest.mark.parametrize("text", ["[1,2", "1,2]", " [4 "])
def test_a_list_with_a_bracket_left_open_is_refused(text) -> None:
    with pytest.raises(ConfigError) as error:
        convert("sizes", text, list[int], "sizes=[1, 2]")
    assert str(error.value) == (f"sizes expects a list of integers, got '{text}' (a bracket "
                                "left open); e.g. sizes=[1, 2]")


@pytest.mark.parametrize("text", ["[1,2]", "1,2", " [1, 2] "])
def test_a_list_reads_with_its_brackets_or_without(text) -> None:
    assert convert("sizes", text, list[int], "sizes=[1, 2]") == [1, 2]

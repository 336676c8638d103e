"""plan.py refuses an option it would ignore when the user typed it, at its default value as
at any other (`top=10` without search=true is refused as `top=11` is), and never for a default
the entry contract filled in; the contract says which options were given.
"""

from __future__ import annotations

import pytest

from recipes.plan import command
from trainer.entry.commands import PLAN
from trainer.entry.contract import main, parse_arguments

# rule, the option, the command line with the option at its default, the same at another value
AT_DEFAULT = [
    (command.confirm_needs_search, "confirm", [], "0", "3"),
    (command.spread_needs_confirm, "confirm_pick", ["search=true"], "top", "spread"),
    (command.confirm_steps_needs_confirm, "confirm_steps", [], "6", "3"),
    (command.top_needs_search, "top", [], "10", "11"),
    (command.search_without_what_ifs, "sharding", ["search=true"], "null", "none"),
    (command.search_without_what_ifs, "offload", ["search=true"], "false", "true"),
    (command.search_without_what_ifs, "fp8_weights", ["search=true"], "false", "true"),
    (command.search_without_plan_only, "tokens", ["search=true"], "null", "1000000"),
    (command.search_without_plan_only, "mfu", ["search=true"], "0.4", "0.5"),
    (command.search_without_plan_only, "groups", ["search=true"], "null", "2"),
]


def _problem(rule, argv: list[str]) -> str | None:
    args = parse_arguments(PLAN, ["recipe=tiny_dp1", *argv])
    alone = rule(args.options, args.given)
    assert command.search_option_problem(args.options, args.given) == alone
    return alone


def test_the_contract_says_which_options_were_given() -> None:
    args = parse_arguments(PLAN, ["recipe=tiny_dp1", "top=10", "search=false"])
    assert args.given == {"top", "search"}
    assert (args["top"], args["confirm_steps"]) == (10, 6)  # the declared defaults, filled in
    assert parse_arguments(PLAN, ["recipe=tiny_dp1"]).given == frozenset()


@pytest.mark.parametrize(("rule", "key", "before", "default", "other"), AT_DEFAULT,
                         ids=[f"{row[1]}={row[3]}" for row in AT_DEFAULT])
def test_an_option_typed_at_its_default_is_refused_as_at_another_value(rule, key, before,
                                                                       default, other) -> None:
    args = parse_arguments(PLAN, [*before, f"{key}={default}"])
    assert args[key] == PLAN.options[key].default  # the premise: typed at the default
    at_other = _problem(rule, [*before, f"{key}={other}"])
    assert at_other.startswith(f"{key}={other} ")
    expected = at_other.replace(f"{key}={other}", f"{key}={default}", 1)
    assert _problem(rule, [*before, f"{key}={default}"]) == expected


@pytest.mark.parametrize("argv", [[], ["search=true"], ["search=true", "confirm=2"]])
def test_defaults_filled_in_are_not_refused(argv) -> None:
    args = parse_arguments(PLAN, ["recipe=tiny_dp1", *argv])
    assert command.search_option_problem(args.options, args.given) is None


@pytest.mark.parametrize("argv", [["search=true", "calibrate=false"],
                                  ["search=true", "verify=false"],
                                  ["calibrate=true", "search=false", "verify=false"]])
def test_a_false_that_skips_nothing_is_not_refused(argv) -> None:
    """`calibrate=true` would skip a search or verify, and a search would skip verify=true:
    those rules refuse values; `calibrate=false` or `verify=false` is what happens anyway."""
    assert _problem(command.calibrate_alone, argv) is None
    assert _problem(command.verify_without_search, argv) is None


def test_plan_py_refuses_top_at_its_default_in_one_line(capsys) -> None:
    assert main(PLAN, ["recipe=tiny_dp1", "top=10"]) == 2
    assert capsys.readouterr().err == ("error: top=10 is how many layouts the layout search "
                                       "lists; add search=true, or drop top=\n")

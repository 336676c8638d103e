"""`key=` with nothing after '=' is refused with a real value to give, not `key=null` (the
default restated): a file the option's path pattern matches, a choice, an `e.g.` of its help,
else what the option takes; and leaving the option out keeps the default."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from trainer.entry.commands import PLAN
from trainer.entry.contract import Option, empty_value_line, parse_arguments, real_example


@pytest.mark.parametrize(("key", "line"), [
    ("cluster", "cluster= is empty; give it a value, e.g. cluster=conf/cluster/cpu_local.yaml, "
     "or leave cluster= out for the default (null)"),
    ("megatron_args", "megatron_args= is empty; give it a value (a string: a file of Megatron-LM "
     "pretrain_gpt.py or pretrain_hybrid.py arguments to plan instead of a recipe), or leave "
     "megatron_args= out for the default (null)"),
    ("tokens", "tokens= is empty; give it a value, e.g. tokens=15e12, or leave tokens= out for "
     "the default (null)"),
    ("sharding", "sharding= is empty; give it a value, e.g. sharding=none, or leave sharding= "
     "out for the default (null)"),
    ("mfu", "mfu= is empty; give it a value, e.g. mfu=0.4, or leave mfu= out for the default "
     "(0.4)"),
])
def test_an_empty_value_gives_a_real_example_or_says_to_leave_it_out(key, line) -> None:
    assert empty_value_line(key, PLAN.options[key]) == line
    with pytest.raises(ConfigError) as caught:
        parse_arguments(PLAN, [f"{key}="])
    assert str(caught.value) == line


def test_a_help_example_that_is_no_value_of_the_type_is_not_offered() -> None:
    """`e.g. a virtualenv's bin/python` in a str option's help is prose, not a value."""
    option = Option(None, "the Python (null: the image's; e.g. a virtualenv's bin/python)",
                    type=str | None)
    assert real_example("python", option) is None


def test_a_pattern_that_matches_no_file_gives_no_example() -> None:
    option = Option(None, "conf/nowhere/*.yaml: a file", type=str | None)
    assert real_example("where", option) is None


def test_an_absolute_pattern_is_not_globbed() -> None:
    """Path.glob refuses a pattern that is not relative: no example, and no error."""
    assert real_example("where", Option(None, "/etc/*.conf: a file", type=str | None)) is None

"""`scripts/bench_documents.py blend=conf/data/python_stdlib.yaml` (its usage line) runs the
default recipe on a 2,048-token blend: the bench gives the runs the blend's vocabulary when the
recipe's is smaller, and a run's refusal stays one `error:` line, exit 2.
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from trainer.tools.benchmarks.documents import run_bench_documents, vocab_overrides


def test_a_recipe_smaller_than_the_blends_vocabulary_gets_the_blends() -> None:
    assert vocab_overrides(256, 2048) == ["model.vocab_size=2048"]
    assert vocab_overrides(4096, 2048) == []


def test_no_blend_is_one_line() -> None:
    with pytest.raises(ConfigError, match="blend= is missing"):
        run_bench_documents(None, 3, "tiny_dp1")


def test_a_blend_that_is_not_a_file_is_named_by_the_option(tmp_path) -> None:
    """The bench's option is blend=; its line does not name the data.blend= it becomes."""
    with pytest.raises(ConfigError, match=rf"^blend={tmp_path}/nope.yaml does not exist; name a "
                       r"blend file, e\.g\. blend=conf/data/python_stdlib.yaml$"):
        run_bench_documents(str(tmp_path / "nope.yaml"), 3, "tiny_dp1")
    with pytest.raises(ConfigError, match=rf"^blend={tmp_path} is a directory"):
        run_bench_documents(str(tmp_path), 3, "tiny_dp1")

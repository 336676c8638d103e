"""`scripts/bench_data.py tokenizer=` that cannot be read is one line before anything is written
or timed, not the tokenizer library's traceback at the first timed step.
"""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from trainer.tools.benchmarks.data import bench_tokenizer, run_bench_data


def test_a_missing_tokenizer_is_one_line_before_the_bench_starts(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer=/nope: no such file; name a "
                                          r"tokenizer.json"):
        run_bench_data({"tokenizer": "/nope"})  # nothing else is read first


def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match=r"cannot be read as a tokenizer"):
        bench_tokenizer(str(tmp_path))  # a folder holding one is read as that file

"""A `megatron_args=FILE` the planner cannot read is one `error:` line naming the file and the
fix, exit 2: a directory, prose with an unmatched quote (shlex), bytes that are not UTF-8, and a
flag Megatron-LM's parser refuses (a value of the wrong type, a flag with no value), never a
traceback or argparse's 660-line usage. Each rule fires alone."""

from __future__ import annotations

import argparse

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.megatron_args import to_megatron_args
from recipes.registry import get_recipe
from trainer.entry.commands import PLAN
from trainer.entry.contract import main
from trainer.tools.megatron_args import (
    argument_error_line,
    config_from_megatron_args,
    file_text,
    parse_megatron_argv,
    read_argument_file,
    shell_words,
)

WANTED = ("give a file holding the pretrain_gpt.py arguments (one shell line or several "
          "with \\)")


def test_a_directory_is_said_to_be_one(tmp_path) -> None:
    with pytest.raises(ConfigError) as caught:
        file_text(str(tmp_path))
    assert str(caught.value) == f"megatron_args={tmp_path} is a directory; {WANTED}"


def test_a_missing_file_is_said_not_to_exist(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist; give a file"):
        file_text(str(tmp_path / "absent.sh"))


def test_bytes_that_are_not_utf8_are_one_line(tmp_path) -> None:
    path = tmp_path / "launch.sh"
    path.write_bytes(b"\xff\xfe--num-layers 2")
    with pytest.raises(ConfigError) as caught:
        file_text(str(path))
    assert str(caught.value) == (f"megatron_args={path} is not UTF-8 text (byte 0xff at offset "
                                 f"0); {WANTED}")


def test_an_unmatched_quote_is_one_line_not_shlex_value_error() -> None:
    with pytest.raises(ConfigError) as caught:
        shell_words("README.md", "It's a recipe book\n")
    assert str(caught.value) == ("megatron_args=README.md is not a shell argument list (No "
                                 f"closing quotation); {WANTED}")


def _small_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--position-embedding-type", choices=["rope", "none"])
    return parser


@pytest.mark.parametrize(("argv", "line"), [
    (["--hidden-size", "abc"], "megatron_args=a.sh: --hidden-size 'abc' is not a whole number; "
     "give --hidden-size a whole number"),
    (["--micro-batch-size"], "megatron_args=a.sh: --micro-batch-size has no value (expected one "
     "argument); put its value after it, e.g. --micro-batch-size VALUE, or remove the flag"),
    (["--position-embedding-type", "x"], "megatron_args=a.sh: --position-embedding-type 'x' is "
     "not a choice; give --position-embedding-type one of 'rope', 'none'"),
])
def test_a_value_argparse_refuses_raising_is_one_line(argv, line) -> None:
    """argparse raises ArgumentError for these (exit_on_error=False takes them)."""
    with pytest.raises(ConfigError) as caught:
        parse_megatron_argv(_small_parser(), argv, "a.sh")
    assert str(caught.value) == line


def test_a_check_argparse_makes_by_calling_error_is_one_line_too() -> None:
    """argparse 3.12 calls `error()` itself (exit_on_error or not) for a missing required
    argument: the override takes it, and the shared parser is left as it was."""
    parser = _small_parser()
    parser.add_argument("--num-layers", type=int, required=True)
    with pytest.raises(ConfigError) as caught:
        parse_megatron_argv(parser, ["--hidden-size", "8"], "a.sh")
    assert str(caught.value) == ("megatron_args=a.sh: the following arguments are required: "
                                 "--num-layers; fix the Megatron-LM arguments in the file")
    assert parser.exit_on_error and "error" not in vars(parser)


def test_an_error_line_without_a_file_names_the_flag() -> None:
    error = argparse.ArgumentError(None, "invalid float value: 'x'")
    error.argument_name = "--lr"
    assert argument_error_line(error, None) == "--lr 'x' is not a number; give --lr a number"


@pytest.mark.parametrize(("flags", "line"), [
    ("--hidden-size abc", "--hidden-size 'abc' is not a whole number; give --hidden-size a "
     "whole number"),
    ("--micro-batch-size", "--micro-batch-size has no value (expected one argument)"),
])
def test_megatrons_own_parser_names_the_file_flag_and_value(tmp_path, flags, line) -> None:
    path = tmp_path / "launch.sh"
    argv = " ".join(to_megatron_args(get_recipe("tiny_dp1")))
    path.write_text(f"torchrun pretrain_gpt.py {argv} {flags}\n")
    with pytest.raises(ConfigError) as caught:
        config_from_megatron_args(read_argument_file(str(path)), source=str(path))
    assert str(caught.value).startswith(f"megatron_args={path}: {line}")


@pytest.mark.parametrize("content", [b"It's prose\n", b"\xff\xfe--num-layers 2",
                                     b"pretrain_gpt.py --num-layers 2 --hidden-size abc\n"])
def test_plan_py_prints_one_error_line_and_exits_2(tmp_path, capsys, content) -> None:
    path = tmp_path / "launch.sh"
    path.write_bytes(content)
    assert main(PLAN, [f"megatron_args={path}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(
        f"error: megatron_args={path}")
    assert "usage" not in captured.err and "Traceback" not in captured.err


def test_plan_py_says_a_directory_is_one(tmp_path, capsys) -> None:
    assert main(PLAN, [f"megatron_args={tmp_path}"]) == 2
    assert capsys.readouterr().err == f"error: megatron_args={tmp_path} is a directory; {WANTED}\n"


def _without(argv: list[str], flag: str, values: int) -> list[str]:
    at = argv.index(flag)
    return argv[:at] + argv[at + 1 + values:]


@pytest.mark.parametrize(("recipe", "change", "line"), [
    ("tiny_dp1", lambda a: [*a, "--recompute-granularity", "selective", "--recompute-method",
                            "uniform"],
     "--recompute-method uniform with --recompute-granularity selective: Megatron-LM takes a "
     "method for full recompute only; drop --recompute-method"),
    ("tiny_dp1", lambda a: [*a, "--recompute-granularity", "selective",
                            "--recompute-num-layers", "2"],
     "--recompute-num-layers 2 with --recompute-granularity selective: Megatron asserts it is "
     "unset there; drop --recompute-num-layers"),
    ("tiny_dp1_recompute", lambda a: _without(a, "--recompute-method", 1),
     "--recompute-granularity full needs --recompute-method uniform (Megatron asserts it); "
     "add it"),
    ("tiny_dp1_recompute", lambda a: _without(a, "--recompute-num-layers", 1),
     "--recompute-granularity full needs --recompute-num-layers N (Megatron asserts it); "
     "add it"),
    ("tiny_dp1_recompute", lambda a: [*a, "--recompute-method", "block"],
     "--recompute-method block: this project's full recompute is uniform (train.recompute=full, "
     "train.recompute_num_layers); use --recompute-method uniform"),
])
def test_recompute_flags_megatron_refuses_are_one_line(recipe, change, line) -> None:
    argv = change(to_megatron_args(get_recipe(recipe)))
    with pytest.raises(ConfigError) as caught:
        config_from_megatron_args(argv)
    assert str(caught.value) == line


def test_megatron_fsdp_alone_has_the_distributed_optimizer_as_megatron_lm_gives_it() -> None:
    """Megatron-LM turns it on itself for Megatron FSDP (training/arguments.py:1106-1112)."""
    argv = _without(to_megatron_args(get_recipe("tiny_dp2_fsdp")), "--use-distributed-optimizer",
                    0)
    cfg, _ = config_from_megatron_args(argv)
    assert cfg.optimizer.distributed and cfg.optimizer.fsdp == "optim_grads_params"


def test_optimizer_offload_without_the_precision_aware_flag_is_one_line() -> None:
    """Megatron-LM asserts it (training/arguments.py:1803-1807)."""
    argv = _without(to_megatron_args(get_recipe("tiny_dp2_bf16_offload")),
                    "--use-precision-aware-optimizer", 0)
    with pytest.raises(ConfigError) as caught:
        config_from_megatron_args(argv)
    assert str(caught.value) == (
        "--optimizer-cpu-offload without --use-precision-aware-optimizer: Megatron-LM asserts "
        "the offload runs through that flag's code path; add --use-precision-aware-optimizer")

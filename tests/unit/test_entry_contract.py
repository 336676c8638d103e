"""Every script goes through the one entry contract: a few lines around one command object,
help, typed options, one-line refusals with exit 2, and two explicit paths for training."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from tests.hang import HANG_S
from trainer.entry import commands, pipeline
from trainer.entry.commands import BENCH_STEP, COMMANDS, PLAN, PRETRAIN, SCALING
from trainer.entry.contract import help_text, parse_arguments

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
RECIPE_SCRIPTS = {"pretrain.py", "bench_step.py", "plan.py", "validate_resume.py",
                  "bench_search.py"}


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=REPO,
        timeout=HANG_S, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )


def _shape_of(script: Path) -> list[str]:
    """The script's statements, by kind: what the contract allows a script to be."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    return [type(node).__name__ for node in tree.body]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_script_is_a_docstring_and_main_of_one_command(script):
    """A docstring (the usage), sys/pathlib, the repository on sys.path, one command object
    and the contract's `main`, the main guard: nothing else."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    assert ast.get_docstring(tree).startswith(tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    assert _shape_of(script) == ["Expr", "Import", "ImportFrom", "Expr", "ImportFrom",
                                 "ImportFrom", "If"]
    imports = [(node.module, [a.name for a in node.names]) for node in tree.body
               if isinstance(node, ast.ImportFrom)]
    assert imports[0] == ("pathlib", ["Path"])
    assert imports[1][0] == "trainer.entry.commands" and len(imports[1][1]) == 1
    assert imports[2] == ("trainer.entry.contract", ["main"])
    name = imports[1][1][0]
    guard = ast.unparse(tree.body[-1])
    assert guard == f"if __name__ == '__main__':\n    sys.exit(main({name}))"
    assert getattr(commands, name).script == script.name


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_usage_examples_keep_their_line_breaks(script):
    """A usage example continued with a lone backslash would be joined into one long line of
    `--help` (Python reads backslash-newline in a string as nothing): write it doubled."""
    source = script.read_text(encoding="utf-8")
    written = source[source.index('"""') + 3:source.index('"""', source.index('"""') + 3)]
    assert ast.get_docstring(ast.parse(source), clean=False) == written.replace("\\\\", "\\")


def test_every_command_has_its_script():
    assert sorted(command.script for command in COMMANDS) == [s.name for s in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_works_for_every_script(script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"usage: python scripts/{script.name}" in result.stdout
    if script.name in RECIPE_SCRIPTS:
        assert "recipes (default stdlib_bpe_tp2_pp2):" in result.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_mistake_is_one_line_and_exit_2_for_every_script(script):
    result = run_script(script, "parallel.tensr=2")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert all(line.startswith("error: ") for line in lines) and result.stderr.endswith("\n")
    # launch.py also says, in a line of its own, that cluster= is missing
    assert len(lines) == (2 if script.name == "launch.py" else 1)
    assert "Traceback" not in result.stderr
    if script.name in RECIPE_SCRIPTS:
        assert "did you mean parallel.tensor" in result.stderr


BROKEN = ["scheduler.warmup_iters=-1", "optimizer.lr=-1", "data.source=blend",
          "data.blend=conf/data/typo.yaml"]
SAID = ["error: scheduler.warmup_iters=-1 must not be negative; set scheduler.warmup_iters=0 to "
        "turn it off",
        "error: optimizer.lr=-1.0 must be positive; set optimizer.lr, e.g. 3e-4",
        "error: data.blend=conf/data/typo.yaml does not exist; name a blend file, e.g. "
        "data.blend=conf/data/python_stdlib.yaml"]


def test_every_mistake_found_before_launch_is_said_one_line_each():
    """A scheduler mistake does not hide a typo in the blend path: the launching process
    says every value and path problem it finds, each in its own line, and starts nothing."""
    result = run_script(REPO / "scripts" / "pretrain.py", "recipe=tiny_dp1", *BROKEN)
    assert (result.returncode, result.stderr.splitlines()) == (2, SAID)
    launch = run_script(REPO / "scripts" / "launch.py", "recipe=tiny_dp1", *BROKEN, "time=4h",
                        "cluster=conf/cluster/cpu_slurm_2x2.yaml")
    assert launch.returncode == 2
    assert launch.stderr.splitlines() == [
        *SAID[:2], "error: time='4h' is not a Slurm time limit; write HH:MM:SS (e.g. "
        "04:00:00), D-HH:MM:SS or minutes", SAID[2]]
    overrides = run_script(REPO / "scripts" / "pretrain.py", "parallel.tensr=2", "optimizer.lrr=1")
    assert [line.split(":")[1] for line in overrides.stderr.splitlines()] == [
        " override 'parallel.tensr=2'", " override 'optimizer.lrr=1'"]
    options = run_script(REPO / "scripts" / "bench_step.py", "steps=0", "warmup=0")
    assert options.stderr.splitlines() == [
        "error: steps=0 is too few interleaved pairs for a median and spread; use steps=5 or "
        "more", "error: warmup=0 must be a positive whole number, e.g. warmup=2"]


def test_options_are_typed_and_split_from_the_rest():
    args = parse_arguments(BENCH_STEP, ["steps=7", "recipe=tiny_dp1", "optimizer.lr=1e-3"])
    assert args.options == {"steps": 7, "warmup": 3}
    assert args.rest == ("recipe=tiny_dp1", "optimizer.lr=1e-3")
    with pytest.raises(ConfigError, match="steps=4 is too few interleaved pairs for a median "
                       "and spread; use steps=5 or more"):
        parse_arguments(BENCH_STEP, ["steps=4"])
    with pytest.raises(ConfigError, match="steps expects an integer, got 'many'"):
        parse_arguments(BENCH_STEP, ["steps=many"])
    # pretrain has no own options: steps= is other scripts' (_misplaced_option).
    with pytest.raises(ConfigError, match=r"^steps= is an option of scripts/bench_step.py and "
                       r"scripts/validate_resume.py \(and \d+ more\), not of pretrain.py"):
        parse_arguments(PRETRAIN, ["steps=7"])
    plan = parse_arguments(PLAN, ["tokens=15.6e12", "verify=true", "--json", "recipe=x"])
    assert (plan["tokens"], plan["verify"], plan.flags) == (15_600_000_000_000, True,
                                                             frozenset({"--json"}))
    with pytest.raises(ConfigError, match="sharding expects one of none, dist_opt"):
        parse_arguments(PLAN, ["sharding=zero9"])
    # where the choices name `none` it is that choice (DDP), not null (the run's own sharding)
    assert parse_arguments(PLAN, ["sharding=none"])["sharding"] == "none"
    assert parse_arguments(PLAN, ["sharding=null"])["sharding"] is None
    for mfu in ("0", "2"):  # a share of the peak: no step reaches more than all of it
        with pytest.raises(ConfigError, match=f"mfu={float(mfu)} is a share of the peak FLOP/s, "
                           "above 0 and at most 1, e.g. mfu=0.4"):
            parse_arguments(PLAN, [f"mfu={mfu}"])
    sweep = parse_arguments(SCALING, ["scaling.world_sizes=[4,1,2]", "cluster=c.yaml"])
    assert sweep["scaling.world_sizes"] == [4, 1, 2] and sweep["cluster"] == "c.yaml"


def test_an_option_given_twice_is_refused_and_an_override_twice_is_the_later():
    """An option is one choice (`print=config print=megatron_args` would print only the
    second): refused naming both. A config override given twice applies in order, the later
    winning, as Megatron-LM's command line does (recipes/config/overrides.py)."""
    with pytest.raises(ConfigError, match=r"^search= given twice \(true, false\); keep one$"):
        parse_arguments(PLAN, ["search=true", "recipe=tiny_dp1", "search=false"])
    with pytest.raises(ConfigError, match=r"^print= given twice \(config, config\); keep one$"):
        parse_arguments(PRETRAIN, ["print=config", "print=config"])
    args = parse_arguments(PLAN, ["optimizer.lr=1e-3", "optimizer.lr=2e-3"])
    assert args.rest == ("optimizer.lr=1e-3", "optimizer.lr=2e-3")


@pytest.mark.parametrize(("error", "printed"), [("UserError", False), ("RankUserError", True)])
def test_a_rank_other_than_0_prints_only_the_mistake_it_met_alone(monkeypatch, capsys, error,
                                                                   printed):
    """Every rank meets a config mistake alike, so rank 0 says it; a rank that met bad data in
    its own samples says it itself (else the run would end with exit 2 and no line)."""
    from plugins.protocol import errors
    from trainer.entry.contract import Command, main

    def fail(args):
        raise getattr(errors, error)("sample 3 of source a holds token id 300")

    monkeypatch.setenv("RANK", "1")
    assert main(Command("pretrain.py", fail), []) == 2
    said = capsys.readouterr().err
    assert said == ("error: sample 3 of source a holds token id 300\n" if printed else "")


def test_a_command_without_a_rest_refuses_other_words():
    from trainer.entry.commands import BENCH_PACKING

    with pytest.raises(ConfigError, match="bench_packing.py does not take 'blend=x'; it takes "
                       "documents=, seed="):
        parse_arguments(BENCH_PACKING, ["blend=x"])


def test_help_lists_a_commands_own_options():
    assert ("steps=  measured rounds of each step (interleaved pairs, at least 5) (an integer, "
            "default 20)") in help_text(BENCH_STEP)
    assert "print=  config: print the resolved config" in help_text(PRETRAIN)
    assert "check=  paths: check every path the run names" in help_text(PRETRAIN)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.takes_recipe],
                         ids=lambda c: c.script)
def test_help_of_every_recipe_command_names_every_registered_recipe(command, monkeypatch):
    """Every family's recipes are in --help, a family added to the registry included."""
    from recipes import registry

    def qwen_tiny_dp1():
        """A family added later."""
        return registry.RECIPES["tiny_dp1"]()

    monkeypatch.setitem(registry.RECIPES, "qwen_tiny_dp1", qwen_tiny_dp1)
    listed = {line.split()[0] for line in help_text(command).splitlines()
              if line.startswith("  ")}
    assert set(registry.RECIPES) <= listed


def _architecture_rows(text: str) -> dict[str, str]:
    """convert.py --help's architecture section: label -> its recipes, wrapped lines joined."""
    section = text.split("Hugging Face architectures")[1].split("\n\n")[0]
    rows: dict[str, str] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("      "):  # a wrapped line of the row above
            last = list(rows)[-1]
            rows[last] += " " + line.strip()
        else:
            label, _, recipes = line.strip().partition(": ")
            rows[label] = recipes
    return rows


def test_convert_help_names_every_hf_architecture_with_its_recipes():
    """Each architecture the import and export map is named with the recipes of its shape; the
    GPT recipes no architecture fits are named as such."""
    from trainer.entry.commands import CONVERT
    from trainer.interop.hf_config import ARCHITECTURES

    rows = _architecture_rows(help_text(CONVERT))
    assert [label.split()[0] for label in rows] == [*ARCHITECTURES, "no"]
    assert "hf_tiny_llama" in rows["LlamaForCausalLM (llama)"].split(", ")
    assert "hf_tiny_mixtral" in rows["MixtralForCausalLM (mixtral)"].split(", ")
    assert "nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16" in rows[
        "NemotronHForCausalLM (nemotron_h)"].split(", ")
    assert {"tiny_dp1", "nemotron4_15b_tp8_pp2_dp4"} <= set(rows["no architecture"].split(", "))


def test_an_architecture_added_to_the_list_is_in_convert_help(monkeypatch):
    from trainer.entry.commands import CONVERT
    from trainer.interop import hf_config

    monkeypatch.setitem(hf_config.ARCHITECTURES, "QwenForCausalLM", ("qwen", hf_config.gpt))
    assert "QwenForCausalLM (qwen)" in _architecture_rows(help_text(CONVERT))


def test_training_has_two_explicit_paths(monkeypatch):
    """The launching process and a rank run different functions, chosen once: a rank never
    prepares data or starts ranks, the launcher never runs the rank function."""
    calls = []
    monkeypatch.setattr(pipeline, "launch_and_wait", lambda args, extra=(), phased=False:
                        calls.append(("launch", tuple(extra))) or 0)
    monkeypatch.setattr(pipeline, "run_as_rank", lambda rank, args: calls.append(("rank",)) or 0)
    args = parse_arguments(commands.BENCH_CHECKPOINT, ["size=both"])
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert commands.BENCH_CHECKPOINT.run(args) == 0
    assert calls == [("launch", ("recipe=tiny_dp2_distopt",)),
                     ("launch", ("recipe=tiny_dp2_distopt", *commands.SIZE_100M))]
    calls.clear()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert commands.BENCH_CHECKPOINT.run(args) == 0
    assert calls == [("rank",)]



def test_the_checkpoint_benchmarks_own_recipe_is_the_one_its_checks_see(monkeypatch):
    """bench_checkpoint adds recipe=tiny_dp2_distopt to its launches; its pre-launch check
    resolved the command line without it (the default recipe, whose blend made
    data.source=synthetic, its documented command, a refusal)."""
    monkeypatch.setattr(pipeline, "launch_and_wait", lambda args, extra=(), phased=False: 0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = parse_arguments(commands.BENCH_CHECKPOINT, ["size=tiny", "data.source=synthetic"])
    assert commands.BENCH_CHECKPOINT.run(args) == 0
    refused = parse_arguments(commands.BENCH_CHECKPOINT,
                              ["size=tiny", "data.source=synthetic", "dry_run=true"])
    with pytest.raises(ConfigError, match="^dry_run=true: .* trains to measure what it reports"):
        commands.BENCH_CHECKPOINT.run(refused)

@pytest.mark.parametrize(("recipe", "on_gpu", "expected"), [
    ("tiny_tp2", True, {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
                        "NCCL_NVLS_ENABLE": "0"}),
    ("tiny_dp2", True, {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "NCCL_NVLS_ENABLE": "0"}),
    ("tiny_tp2", False, {"OMP_NUM_THREADS": "1"}),  # CPU ranks: their threads, no NCCL/CUDA
])
def test_the_local_launcher_gives_gpu_ranks_their_environment(monkeypatch, tmp_path, recipe,
                                                              on_gpu, expected):
    from recipes.resolve import resolve_config
    from trainer.launch import local

    seen = {}
    monkeypatch.setattr(local, "launch_local_ranks",
                        lambda world, script, args, environment: seen.update(environment) or 0)
    cfg = resolve_config([f"recipe={recipe}", f"run_dir={tmp_path}"])
    args = parse_arguments(PRETRAIN, [f"recipe={recipe}"])
    assert pipeline.start_local_ranks(cfg, tmp_path, args, on_gpu) == 0
    assert {k: v for k, v in seen.items() if k != pipeline.PREFLIGHT_DONE_ENV} == expected


def test_known_harmless_library_warnings_are_filtered_here_and_in_child_processes():
    """Each message of the table is silenced, in the process that calls `quiet_known_noise`
    (warnings and library logs) and (PYTHONWARNINGS) in the processes a command starts; any
    other warning still prints."""
    from trainer.entry.library_noise import NOISE, python_warnings

    said = [noise.message for noise in NOISE if noise.logger is None]
    code = ("import warnings\n"
            f"for text in {said!r} + ['Something else, worth reading']:\n"
            "    warnings.warn(text + ' (as the library says it)')\n")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=HANG_S, env={"PYTHONWARNINGS": python_warnings()})
    assert [line for line in quiet.stderr.splitlines() if "UserWarning" in line] == [
        "<string>:3: UserWarning: Something else, worth reading (as the library says it)"]
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_S, env={})
    assert loud.stderr.count("UserWarning") == len(said) + 1
    logged = [(noise.logger, noise.message) for noise in NOISE if noise.logger is not None]
    here = ("import logging\nfrom trainer.entry.library_noise import quiet_known_noise\n"
            "quiet_known_noise()\n" + code
            + f"for name, text in {logged!r} + [('elsewhere', 'Another line, worth reading')]:\n"
            "    logging.getLogger(name).warning(text + ' (as the library logs it)')\n")
    quieted = subprocess.run([sys.executable, "-c", here], capture_output=True, text=True,
                             timeout=HANG_S, env={}, cwd=REPO)
    assert quieted.returncode == 0, quieted.stderr[-3000:]
    assert [line for line in quieted.stderr.splitlines() if "as the library" in line] == [
        "<string>:6: UserWarning: Something else, worth reading (as the library says it)",
        "Another line, worth reading (as the library logs it)"]


def test_print_config_is_the_resolved_config_that_config_reads_back(tmp_path):
    """`print=config`: any recipe with its overrides, every field, as YAML; nothing starts.
    Saved, it is a config `config=FILE` reproduces exactly."""
    from recipes.config.io import load_config
    from recipes.resolve import resolve_config

    argv = ["recipe=8b_tp8_pp4_dp2", "model.seq_length=4096", "train.train_iters=7000"]
    result = run_script(REPO / "scripts" / "pretrain.py", *argv, "print=config")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "# Resolved configuration of recipe 'llama3_8b_tp8_pp4_dp2'."
    assert "  seq_length: 4096" in lines and "  vocab_size: 128256" in lines
    saved = tmp_path / "printed.yaml"
    saved.write_text(result.stdout)
    assert load_config(saved) == resolve_config(argv)
    refused = run_script(REPO / "scripts" / "pretrain.py", *argv, "train.train_iters=-1",
                         "print=config")
    assert refused.returncode == 2 and refused.stderr.startswith("error: train.train_iters=-1")


def test_a_reader_that_stops_early_ends_the_script_quietly():
    """`scripts/nemotron_table.py | head` (the page, 100 kB, over a pipe's buffer): the script
    ends with 141 (128 + SIGPIPE, as a shell tool ends) and writes nothing to stderr, not a
    BrokenPipeError traceback."""
    script = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "nemotron_table.py")], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert script.stdout.read(100).startswith(b"# Nemotron recipes")
    script.stdout.close()
    assert script.wait(timeout=HANG_S) == 141
    assert script.stderr.read() == b""


def test_another_scripts_option_or_a_near_miss_of_an_own_one_is_named():
    """A recipe command hands unknown words on as config overrides, whose error said only
    'unknown config key'; an option of another script, or one close to the command's own, is
    named as such. Config keys and the command's own options pass."""
    with pytest.raises(ConfigError, match=r"^search= is an option of scripts/plan.py, not of "
                       r"pretrain.py; run it there$"):
        parse_arguments(PRETRAIN, ["recipe=tiny_dp1", "search=true"])
    with pytest.raises(ConfigError, match=r"^unknown option clustr; did you mean cluster=\?$"):
        parse_arguments(PLAN, ["clustr=conf/cluster/cpu_local.yaml"])
    args = parse_arguments(PLAN, ["recipe=tiny_dp1", "run_dir=/tmp/x", "model.num_layers=2",
                                  "cluster=c.yaml"])
    assert args.rest == ("recipe=tiny_dp1", "run_dir=/tmp/x", "model.num_layers=2")


def test_help_and_examples_write_defaults_as_the_command_line_does():
    """`verify=false`, not Python's False; null for None."""
    text = help_text(PLAN)
    assert "(true or false, default false)" in text and "default False" not in text
    with pytest.raises(ConfigError, match=r"e\.g\. verify=false"):
        parse_arguments(PLAN, ["verify="])


def test_help_names_the_recipe_a_command_runs_when_none_is_named():
    """The checkpoint benchmark runs tiny_dp2_distopt without recipe=: its --help says that
    recipe, the other recipe commands the project's default."""
    from recipes.registry import DEFAULT_RECIPE
    from trainer.entry.commands import BENCH_CHECKPOINT, PRETRAIN, checkpoint_sizes

    args = parse_arguments(BENCH_CHECKPOINT, ["size=tiny"])
    assert checkpoint_sizes(args) == [[f"recipe={BENCH_CHECKPOINT.default_recipe}"]]
    assert f"recipes (default {BENCH_CHECKPOINT.default_recipe}):" in help_text(BENCH_CHECKPOINT)
    assert BENCH_CHECKPOINT.default_recipe != DEFAULT_RECIPE
    assert f"recipes (default {DEFAULT_RECIPE}):" in help_text(PRETRAIN)


@pytest.mark.parametrize("typed", [["--out", "x.png"], ["-o", "x.png"], ["--out=x.png"]])
def test_an_argparse_style_option_is_named_not_taken_for_a_run_directory(typed):
    """compare_runs.py's positionals are run directories: `--out x.png` was one, refused as a
    folder without metrics; it is now said as the key=value option it meant."""
    from trainer.entry.commands import COMPARE_RUNS

    with pytest.raises(ConfigError) as error:
        parse_arguments(COMPARE_RUNS, ["runs/a", *typed])
    assert str(error.value) == (f"compare_runs.py takes out=VALUE, not '{typed[0]}' (its options "
                                "are key=value); write out=...")
    assert parse_arguments(COMPARE_RUNS, ["runs/a", "out=x.png"]).rest == ("runs/a",)


def test_the_value_after_a_dashed_option_is_not_a_second_mistake():
    from trainer.entry.commands import BENCH_PACKING

    with pytest.raises(ConfigError) as error:
        parse_arguments(BENCH_PACKING, ["--documents", "1000"])
    assert str(error.value) == ("bench_packing.py takes documents=VALUE, not '--documents' (its "
                                "options are key=value); write documents=...")

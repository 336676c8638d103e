"""scripts/scaling.py's refusals of user mistakes, each rule fired alone, each one line, before
any size runs or is submitted.

Why: a sweep checked each size only when it came to it (a 64-rank job was submitted, or a
1-rank size trained in full, before the next size was refused); a bad scaling.out or a damaged
sweep.json ended in a traceback; and options the sweep does not use (Slurm's account= without
cluster=, a recipe beside scaling.report=) were ignored without a word.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.machine import MachineInfo
from recipes.registry import get_recipe
from tests.hang import HANG_S
from trainer.entry.commands import SCALING
from trainer.entry.contract import parse_arguments
from trainer.launch.cluster import LaunchArgs
from trainer.tools.scaling.checks import (
    cluster_only_problem,
    field_names,
    given_options,
    inapplicable_problem,
    out_problem,
    report_only_problem,
    rest_names,
    size_line,
    sweep_problem,
)
from trainer.tools.scaling.report import Point, ScalingOptions, plan_points, scaling_options

REPO = Path(__file__).resolve().parents[2]
CPU_SLURM = "conf/cluster/cpu_slurm_2x2.yaml"  # 2 nodes of 2 CPU ranks
TINY = ["recipe=tiny_dp1", "data.source=synthetic"]
NO_GPUS = MachineInfo(gpus=0, launched_world_size=None)


def _parsed(argv: list[str]):
    args = parse_arguments(SCALING, argv)
    return args, scaling_options(args.options)


def _inapplicable(argv: list[str]) -> str | None:
    args = parse_arguments(SCALING, argv)
    return inapplicable_problem(args.options, args.given, args.flags, args.rest)


def _nothing_runs(monkeypatch) -> None:
    import trainer.tools.scaling.sweep as sweep

    monkeypatch.setattr(sweep, "_run_here", lambda *a: pytest.fail("a size ran"))
    monkeypatch.setattr(sweep, "_submit", lambda *a: pytest.fail("a size was submitted"))


# --- 1. every size checked against the machine or cluster before the first starts -------------

def test_size_line_names_the_size_and_the_way_out():
    assert size_line(64, "found 0 GPUs") == (
        "scaling.world_sizes has 64: found 0 GPUs; or drop 64 from scaling.world_sizes")


def test_a_size_this_machine_cannot_run_is_refused_before_the_first_trains(
        tmp_path, monkeypatch):
    """[1, 64] on CPU: the 1-rank size trained in full, then 64 ranks were refused."""
    import recipes.config.machine as machine
    import trainer.tools.scaling.sweep as sweep

    _nothing_runs(monkeypatch)
    monkeypatch.setattr(machine, "detect_machine", lambda: NO_GPUS)
    args, options = _parsed([*TINY, "scaling.world_sizes=[1,64]",
                             f"scaling.out={tmp_path / 'sweep'}"])
    with pytest.raises(ConfigError) as error:
        sweep.run_scaling(options, None, list(args.rest))
    text = str(error.value)
    assert text.startswith("scaling.world_sizes has 64: recipe tiny_dp1 needs 64 GPUs")
    assert "at most 16 local ranks" in text and text.endswith(
        "; or drop 64 from scaling.world_sizes") and "\n" not in text
    assert not (tmp_path / "sweep").exists()  # nothing written either


def test_each_size_gets_the_local_runs_preflight_before_the_first_trains():
    """The pipeline's own pre-flight (memory fit), handed down by the command: sizes it passes
    go through, quietly; the first it refuses is said as that size's line."""
    from trainer.entry.pipeline import preflight
    from trainer.tools.scaling.sweep import _check_points, check_sizes_here

    cfg = get_recipe("tiny_dp1")
    points = plan_points(cfg, ScalingOptions(world_sizes=[1, 2]), Path("/tmp/unused"))
    configs = _check_points(TINY, points)
    check_sizes_here(TINY, points, configs, NO_GPUS, preflight)  # no refusal

    def refuse_two(cfg, machine):
        if cfg.cluster.gpus_per_node == 2:
            raise ConfigError("does not fit")

    with pytest.raises(ConfigError, match="^scaling.world_sizes has 2: does not fit; or drop 2"):
        check_sizes_here(TINY, points, configs, NO_GPUS, refuse_two)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_size_the_cluster_cannot_place_is_refused_before_the_first_job(
        tmp_path, monkeypatch, dry_run):
    """[2, 8] on 2 nodes of 2: the 2-rank job was printed (or submitted), then 8 refused."""
    import trainer.tools.scaling.sweep as sweep

    _nothing_runs(monkeypatch)
    args, options = _parsed([*TINY, "scaling.world_sizes=[2,8]",
                             f"scaling.out={tmp_path / 'sweep'}"])
    launch = LaunchArgs(cluster=CPU_SLURM, dry_run=dry_run, rest=list(args.rest))
    with pytest.raises(ConfigError) as error:
        sweep.run_scaling(options, launch, list(args.rest))
    text = str(error.value)
    assert text.startswith("scaling.world_sizes has 8: tiny_dp1 needs 4 nodes of 2 GPUs "
                           f"(8 ranks) but cluster={CPU_SLURM} has 2"), text
    assert text.endswith("; or drop 8 from scaling.world_sizes") and "\n" not in text
    assert not (tmp_path / "sweep").exists()


def test_the_dry_run_script_refuses_the_larger_size_before_printing_any_job():
    """The reviewer's command: the 64-rank job's script used to be printed first."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "scaling.py"), "recipe=8b_tp8_pp4_dp2",
         "scaling.world_sizes=[64,128]", "data.source=synthetic",
         "cluster=conf/cluster/h100_80gb_8x8.yaml", "--dry-run"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 2 and "SBATCH" not in result.stdout, result.stdout[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: scaling.world_sizes has 128: llama3_8b_tp8_pp4_dp2 needs 16 nodes of 8 GPUs "
        "(128 ranks) but cluster=conf/cluster/h100_80gb_8x8.yaml has 8; pick a larger cluster "
        "file or a recipe with fewer ranks; or drop 128 from scaling.world_sizes"]


# --- 2. bad paths: scaling.out, a damaged sweep.json ------------------------------------------

def test_scaling_out_that_is_a_file_is_one_line(tmp_path):
    file = tmp_path / "taken"
    file.write_text("x")
    assert out_problem(str(file), "runs") == (
        f"scaling.out={file} is a file, not a directory; give scaling.out a writable "
        "directory, e.g. scaling.out=runs/scaling-<name>")


def test_scaling_out_that_cannot_be_created_is_one_line():
    assert out_problem("/proc/x", "runs").startswith(
        "scaling.out=/proc/x cannot be created (under /proc: ")


def test_the_default_sweep_directory_is_checked_under_output_dir(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    assert out_problem(None, str(file)).startswith(f"output_dir={file} is a file")
    assert out_problem(str(tmp_path / "new" / "sweep"), "runs") is None
    assert not (tmp_path / "new").exists()  # the probe leaves nothing behind


def test_a_bad_scaling_out_stops_the_sweep_before_any_size(tmp_path, monkeypatch):
    import trainer.tools.scaling.sweep as sweep

    _nothing_runs(monkeypatch)
    file = tmp_path / "taken"
    file.write_text("x")
    args, options = _parsed([*TINY, "scaling.world_sizes=[1]", f"scaling.out={file}"])
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        sweep.run_scaling(options, None, list(args.rest))


OPTIONS = field_names(ScalingOptions)
POINTS = field_names(Point)
GOOD = {"options": {"mode": "weak", "world_sizes": [1], "token_budget": 1e9, "cluster": None},
        "points": [dict.fromkeys(POINTS, 1) | {"overrides": ["run_dir=x"]}],
        "model_state_gib": [0.5]}


@pytest.mark.parametrize("sweep, words", [
    ([1], "holds no JSON object"),
    ({"options": {}, "points": []}, "has no 'model_state_gib' key"),
    (GOOD | {"options": {"modes": "weak"}}, "has 'options' that are not the scaling.* options"),
    (GOOD | {"points": [{"gpus": 1}]}, "has 'points' that do not each hold gpus, "),
    (GOOD | {"model_state_gib": []}, "has 'model_state_gib' without one figure for each of "
                                     "its 1 points"),
    # hand-edited values, each of a kind a sweep never writes
    (GOOD | {"options": {"token_budget": "x"}},
     "has options.token_budget='x', not a positive number of tokens"),
    (GOOD | {"options": {"mode": "huge"}}, "has options.mode='huge', neither 'weak' nor"),
    (GOOD | {"options": {"world_sizes": "x"}}, "has options.world_sizes='x', not a list of"),
    (GOOD | {"options": {"world_sizes": [0, 2]}}, "has options.world_sizes=[0, 2], not a list"),
    (GOOD | {"options": {"steps": 2.5}}, "has options.steps=2.5, not a count of steps"),
    (GOOD | {"options": {"cluster": 3}}, "has options.cluster=3, neither a path nor null"),
    (GOOD | {"points": [dict.fromkeys(POINTS, 1) | {"overrides": ["a"], "gpus": "2"}]},
     "has a point with gpus='2', not a count"),
    (GOOD | {"points": [dict.fromkeys(POINTS, 1)]}, "has a point with overrides=1, not a list"),
    (GOOD | {"model_state_gib": ["big"]}, "has model_state_gib figure 'big', not a number"),
])
def test_each_damage_of_sweep_json_is_named(sweep, words):
    assert words in sweep_problem(sweep, OPTIONS, POINTS)
    assert sweep_problem(GOOD, OPTIONS, POINTS) is None


@pytest.mark.parametrize("text, words", [
    ("{\"options\": {", "sweep.json is not JSON (Expecting property name"),
    (json.dumps({"options": {}, "points": []}), "sweep.json has no 'model_state_gib' key"),
])
def test_a_damaged_sweep_json_is_one_line_naming_the_file(tmp_path, text, words):
    from trainer.tools.scaling.sweep import load_sweep

    (tmp_path / "sweep.json").write_text(text)
    with pytest.raises(ConfigError) as error:
        load_sweep(tmp_path)
    line = str(error.value)
    assert line.startswith(f"scaling.report={tmp_path}: {tmp_path / 'sweep.json'} ")
    assert words in line and "not a sweep this tool wrote" in line and "\n" not in line


# --- 3. options that do not apply -------------------------------------------------------------

def test_given_options_are_those_typed_at_their_default_too():
    assert given_options({"account", "retries"}, ["account", "retries", "executor"]) == [
        "account=", "retries="]
    assert rest_names(["recipe=tiny_dp2", "train.global_batch_size=8"]) == [
        "recipe=", "train.global_batch_size="]


def test_launch_options_without_cluster_are_refused():
    assert cluster_only_problem(["account="], None) == (
        "account= applies only to cluster jobs, but without cluster= every size runs here and "
        "would ignore it; drop it, or add cluster=conf/cluster/<file>.yaml to submit each size "
        "as a job")
    assert cluster_only_problem(["account="], CPU_SLURM) is None
    assert cluster_only_problem([], None) is None


def test_sweep_options_beside_scaling_report_are_refused():
    assert report_only_problem("D", ["recipe=", "--dry-run"]) == (
        "recipe=, --dry-run do not apply to scaling.report=D, which reports the finished sweep "
        "as D/sweep.json recorded it; drop them (to run a new sweep, leave scaling.report out)")
    assert report_only_problem(None, ["recipe="]) is None
    assert report_only_problem("D", []) is None


@pytest.mark.parametrize("argv, words", [
    (["recipe=tiny_dp1", "scaling.world_sizes=[1,2]", "account=foo"],
     "account= applies only to cluster jobs"),
    (["recipe=tiny_dp1", "executor=local", "time=10", "--dry-run"],
     "executor=, time=, --dry-run apply only to cluster jobs"),
    (["scaling.report=D", "recipe=tiny_dp2", "scaling.mode=strong", "--dry-run"],
     "recipe=, scaling.mode=, --dry-run do not apply to scaling.report=D"),
    (["scaling.report=D", "cluster=x", "scaling.cluster=y"],
     "scaling.cluster=, cluster= do not apply"),
    (["recipe=tiny_dp1", "retries=0"], "retries= applies only to cluster jobs"),  # its default
    (["recipe=tiny_dp1", "scaling.world_sizes=[1,2]"], None),
    (["recipe=tiny_dp1", f"cluster={CPU_SLURM}", "account=foo", "--dry-run"], None),
    (["scaling.report=D"], None),
])
def test_inapplicable_options_from_the_command_line(argv, words):
    problem = _inapplicable(argv)
    assert (problem is None) if words is None else (words in problem), problem


# --- the script: one line, exit 2, no traceback -----------------------------------------------

def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "scaling.py"), *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=HANG_S)


def test_the_script_says_each_mistake_in_one_line(tmp_path):
    file = tmp_path / "taken"
    file.write_text("x")
    (tmp_path / "sweep.json").write_text("{")
    cases = [
        ((*TINY, "scaling.world_sizes=[1]", f"scaling.out={file}"), "is a file"),
        ((f"scaling.report={tmp_path}",), "sweep.json is not JSON"),
        (("recipe=tiny_dp1", "scaling.world_sizes=[1,2]", "account=foo"), "account= applies"),
    ]
    for argv, words in cases:
        result = _script(*argv)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
        assert lines[0].startswith("error: ") and words in lines[0]

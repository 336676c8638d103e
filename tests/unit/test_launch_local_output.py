"""scripts/launch.py executor=local: the run directory is chosen once, in the launching process
(`<output_dir>/<recipe>-<time>`, or run_dir=), and passed to every rank, not named by each rank
after torchrun's run id; the ranks' output is streamed as they run (NeMo-Run's `tail_logs`)
without torchrun's INFO start-up lines, and the end names the run directory and the job's log.
No launch here: the command the local executor gets, read from a dry run, and the experiment's
`run` replaced. tests/dist/test_launch_local_run.py runs one for real.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from trainer.entry.commands import LAUNCH
from trainer.entry.contract import parse_arguments
from trainer.launch.cluster import (
    launch_args,
    local_executor,
    local_log,
    pin_local_run,
    plan_launch,
    run_launch,
)

REPO = Path(__file__).resolve().parents[2]
CPU_LOCAL = str(REPO / "conf" / "cluster" / "cpu_local.yaml")
STAMP = r"\d{8}-\d{6}"


def parse(argv: list[str]):
    args = parse_arguments(LAUNCH, argv)
    return launch_args(args.options, args.flags, args.rest)


def local(tmp_path: Path, *extra: str) -> list[str]:
    return ["recipe=tiny_dp2", f"cluster={CPU_LOCAL}", "executor=local",
            f"output_dir={tmp_path / 'out'}", f"job_dir={tmp_path / 'jobs'}", *extra]


def test_the_local_command_carries_one_run_directory_named_by_recipe_and_time(capsys, tmp_path):
    pytest.importorskip("nemo_run")
    assert run_launch(parse(local(tmp_path, "--dry-run"))) == 0
    out = capsys.readouterr().out
    named = re.findall(r"^run directory: (\S+)$", out, re.M)
    assert len(named) == 1 and re.fullmatch(
        rf"{re.escape(str(tmp_path / 'out'))}/tiny_dp2-{STAMP}", named[0])
    assert re.findall(r"'run_dir=([^']+)'", out) == named  # the ranks get it, not choose it
    assert not Path(named[0]).exists()  # a dry run only names it


def test_a_local_run_directory_is_claimed_once_and_a_given_one_kept(capsys, tmp_path):
    args = parse(local(tmp_path))
    plan = plan_launch(args)
    now = datetime(2026, 1, 2, 3, 4, 5)
    first, second = pin_local_run(plan, args, now), pin_local_run(plan, args, now)
    base = tmp_path / "out" / "tiny_dp2-20260102-030405"
    assert (first.run_dir, second.run_dir) == (str(base), f"{base}-2")  # same second: -2
    assert base.is_dir() and first.script_args[-1] == f"run_dir={base}"
    given = parse(local(tmp_path, f"run_dir={tmp_path / 'mine'}"))
    kept = pin_local_run(plan_launch(given), given, now)
    assert kept.run_dir == str(tmp_path / "mine")
    assert sum(arg.startswith("run_dir=") for arg in kept.script_args) == 1  # the user's own
    assert capsys.readouterr().out.splitlines()[-1] == f"run directory: {tmp_path / 'mine'}"


def test_the_local_executor_quiets_torchruns_info_lines_unless_loglevel_is_set(monkeypatch,
                                                                                tmp_path):
    pytest.importorskip("nemo_run")
    plan = plan_launch(parse(local(tmp_path)))
    monkeypatch.delenv("LOGLEVEL", raising=False)
    assert local_executor(plan).env_vars["LOGLEVEL"] == "WARNING"
    monkeypatch.setenv("LOGLEVEL", "DEBUG")
    assert local_executor(plan).env_vars["LOGLEVEL"] == "DEBUG"


def test_a_local_run_streams_its_output_and_ends_naming_its_directory_and_log(
        capsys, monkeypatch, tmp_path):
    run = pytest.importorskip("nemo_run")
    calls = []
    monkeypatch.setattr(run.Experiment, "run", lambda self, **kwargs: calls.append(kwargs))
    run_launch(parse(local(tmp_path)))  # nothing ran: the job's state is not SUCCEEDED
    assert calls == [{"detach": False, "tail_logs": True}]
    out = capsys.readouterr().out
    run_dir = re.search(r"^run directory: (\S+)$", out, re.M).group(1)
    assert re.search(rf"^pretrain under NeMo-Run's local executor: \S+; run directory: "
                     rf"{re.escape(run_dir)}; its log: {re.escape(str(tmp_path / 'jobs'))}/\S+$",
                     out, re.M)


def test_the_local_log_is_the_jobs_combined_log(tmp_path):
    assert local_log(str(tmp_path)) == str(tmp_path)  # none written yet: the job's directory
    log = tmp_path / "nemo_run" / "pretrain-abc" / "pretrain" / "0" / "combined.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    assert local_log(str(tmp_path)) == str(log)

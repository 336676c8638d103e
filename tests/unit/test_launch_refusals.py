"""scripts/launch.py's refusals of user mistakes found before (or by) a submit: each rule fired
alone, each one line, nothing submitted and nothing left behind.

Why: a mistyped dry run submitted a real job (pretrain.py's `dry_run=true` is not launch.py's
`--dry-run`), an unwritable job_dir ended in NeMo-Run's traceback, every failed submit read as
Slurm refusing the job and left an empty run folder, options a local run ignores passed
silently, and a time or partition sbatch refuses was rendered into the script.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from plugins.protocol.errors import ConfigError, UserError
from tests.hang import HANG_S
from trainer.entry.commands import LAUNCH
from trainer.entry.contract import parse_arguments
from trainer.launch.cluster import (
    LaunchArgs,
    cluster_dir_problem,
    job_dir,
    job_dir_writable_problem,
    launch_args,
    missing_parts,
    placement_problems,
    plan_launch,
    pretrain_dry_run_problem,
    remove_empty,
    run_launch,
    site_value_problems,
    slurm_name_problem,
    slurm_only_problem,
    time_range_problem,
)
from trainer.launch.slurm_jobs import submit_failure_line

REPO = Path(__file__).resolve().parents[2]
CPU_SLURM = str(REPO / "conf" / "cluster" / "cpu_slurm_2x2.yaml")
CPU_LOCAL = str(REPO / "conf" / "cluster" / "cpu_local.yaml")
TINY = ["recipe=tiny_dp2", "data.source=synthetic"]


def parse(argv: list[str]) -> LaunchArgs:
    args = parse_arguments(LAUNCH, argv)
    return launch_args(args.options, args.flags, args.rest, args.given)


def one_line_refusal(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        plan_launch(parse(argv))
    text = str(error.value)
    assert message in text and "\n" not in text, text


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


# -- 1. pretrain.py's dry_run=true, and a mistyped --dry-run -------------------------------------

def test_pretrain_dry_run_field_is_refused_alone():
    assert pretrain_dry_run_problem(SimpleNamespace(dry_run=False)) is None
    assert pretrain_dry_run_problem(None) is None
    assert pretrain_dry_run_problem(SimpleNamespace(dry_run=True)) == (
        "dry_run=true is pretrain.py's dry run of a layout on one CPU, not launch.py's; to "
        "print the job without submitting use --dry-run (drop dry_run=true)")


def test_dry_run_true_is_refused_before_anything_is_submitted(monkeypatch, tmp_path):
    pytest.importorskip("nemo_run")
    from nemo_run.core.tunnel import client

    commands = []
    monkeypatch.setattr(client.LocalTunnel, "run",
                        lambda self, command, *a, **k: commands.append(command))
    with pytest.raises(ConfigError, match="dry_run=true is pretrain.py's dry run"):
        run_launch(parse([*TINY, f"cluster={CPU_SLURM}", "dry_run=true",
                          f"job_dir={tmp_path / 'jobs'}"]))
    assert commands == [] and _files(tmp_path) == []


@pytest.mark.parametrize("typed", ["--dryrun", "--dry-rn", "-dry-run"])
def test_a_mistyped_dry_run_flag_gets_did_you_mean(typed):
    with pytest.raises(ConfigError) as error:
        parse_arguments(LAUNCH, [*TINY, f"cluster={CPU_SLURM}", typed])
    assert str(error.value) == f"launch.py does not take '{typed}'; did you mean --dry-run?"


def test_the_dry_run_flags_still_parse():
    for flag in ("--dry-run", "--dry_run"):
        assert parse([*TINY, f"cluster={CPU_SLURM}", flag]).dry_run


# -- 2. job_dir must be creatable -----------------------------------------------------------------

def test_an_uncreatable_job_dir_is_refused_alone(tmp_path):
    assert job_dir_writable_problem(None) is None
    assert job_dir_writable_problem(str(tmp_path / "a" / "b")) is None
    assert _files(tmp_path) == []  # the probe leaves nothing behind
    assert job_dir_writable_problem("/proc/jobs") == (
        "job_dir=/proc/jobs cannot be created (under /proc: No such file or directory); set "
        "job_dir to a writable directory on the cluster's shared storage, e.g. "
        "job_dir=/shared/jobs")


def test_launch_with_an_uncreatable_job_dir_is_one_line_exit_2():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "launch.py"), *TINY, f"cluster={CPU_SLURM}",
         "job_dir=/proc/jobs", "--dry-run"], capture_output=True, text=True, cwd=REPO,
        timeout=HANG_S)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: job_dir=/proc/jobs cannot be created (under /proc")


# -- 3. a failed submit: which failure, and nothing left behind ---------------------------------

def _failed(stderr: str, exited: int = 1) -> Exception:
    error = RuntimeError("Encountered a bad command exit code!")
    error.result = SimpleNamespace(stderr=stderr, exited=exited, command="sbatch x.sh")
    return error


NO_SBATCH = ("no sbatch on this machine; launch from a Slurm login node, or print the job with "
             "--dry-run, or use executor=local")


@pytest.mark.parametrize(("stderr", "exited"), [
    ("bash: line 1: sbatch: command not found\n", 127),
    ("/bin/sh: 1: sbatch: not found\n", 127),
    ("bash: sbatch: command not found\n", 1),
])
def test_no_sbatch_here_is_said_as_such(stderr, exited):
    assert submit_failure_line(_failed(stderr, exited)) == NO_SBATCH


@pytest.mark.parametrize("stderr", [
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
    "(connect failure)\n",
    "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "sbatch: error: fetch_config: DNS SRV lookup failed\n"
    "sbatch: fatal: Could not establish a configuration source\n",
])
def test_an_unreachable_controller_is_said_as_such(stderr):
    line = submit_failure_line(_failed(stderr))
    assert line.startswith("sbatch cannot reach the Slurm controller: ") and "\n" not in line
    assert line.endswith("(Slurm's words); check that slurmctld is up and this machine's Slurm "
                         "configuration (scontrol ping, SLURM_CONF), or print the job with "
                         "--dry-run")


def test_a_refusal_is_still_slurms_own_words():
    line = submit_failure_line(_failed("sbatch: error: invalid partition specified: nope\n"))
    assert line == ("sbatch refused the job: invalid partition specified: nope (Slurm's words; "
                    "check partition=, account=, time= and the cluster file against sinfo)")
    assert submit_failure_line(ValueError("not a command")) is None


def test_a_failed_submit_removes_only_what_it_created(monkeypatch, tmp_path):
    pytest.importorskip("nemo_run")
    from invoke.exceptions import UnexpectedExit
    from invoke.runners import Result
    from nemo_run.core.tunnel import client

    def run(self, command, *args, **kwargs):
        if command.startswith("sbatch"):
            raise UnexpectedExit(Result(stdout="", stderr="bash: sbatch: command not found\n",
                                        exited=127, command=command))
        return SimpleNamespace(stdout="", stderr="", return_code=0, exited=0, ok=True,
                               failed=False)

    monkeypatch.setattr(client.LocalTunnel, "run", run)
    (tmp_path / "runs" / "older").mkdir(parents=True)  # a run already there stays
    for jobs in (tmp_path / "new" / "jobs", tmp_path):
        with pytest.raises(UserError) as error:
            run_launch(parse([*TINY, f"cluster={CPU_SLURM}", f"job_dir={jobs}"]))
        assert str(error.value) == NO_SBATCH
        assert _files(tmp_path) == [tmp_path / "runs", tmp_path / "runs" / "older"]


def test_removing_what_was_made_keeps_what_was_there(tmp_path):
    (tmp_path / "kept").mkdir()
    made = missing_parts(tmp_path / "kept" / "a" / "b")
    assert made == [tmp_path / "kept" / "a" / "b", tmp_path / "kept" / "a"]
    (tmp_path / "kept" / "a" / "b").mkdir(parents=True)
    remove_empty(made)
    assert _files(tmp_path) == [tmp_path / "kept"]


# -- 4. Slurm-only options with executor=local ------------------------------------------------

def test_slurm_only_options_with_the_local_executor_are_refused_alone():
    local = parse([*TINY, f"cluster={CPU_LOCAL}", "executor=local", "partition=batch",
                   "account=x", "time=01:00:00", "retries=3"])
    assert slurm_only_problem(local) == (
        "account=, partition=, time=, retries= apply to Slurm jobs only; executor=local runs "
        "here and would ignore them: drop them or use executor=slurm")
    assert slurm_only_problem(parse([*TINY, "executor=local", "rdzv_port=23456"])) == (
        "rdzv_port= applies to Slurm jobs only; executor=local runs here and would ignore it: "
        "drop it or use executor=slurm")
    assert slurm_only_problem(parse([*TINY, "executor=local"])) is None
    assert slurm_only_problem(parse([*TINY, "partition=batch", "retries=3"])) is None
    # Typed at its default, an option is typed all the same.
    assert slurm_only_problem(parse([*TINY, "executor=local", "retries=0"])) == (
        "retries= applies to Slurm jobs only; executor=local runs here and would ignore it: "
        "drop it or use executor=slurm")


def test_local_launch_with_slurm_options_is_refused(tmp_path):
    one_line_refusal([*TINY, f"cluster={CPU_LOCAL}", "executor=local", "partition=batch",
                      "account=x", "time=01:00:00", "retries=3", "--dry-run",
                      f"job_dir={tmp_path}"], "account=, partition=, time=, retries= apply to "
                     "Slurm jobs only")


# -- 5. time limits and names sbatch accepts ------------------------------------------------------

@pytest.mark.parametrize("value", ["90", "0", "90:30", "48:00:00", "1-12", "1-12:30",
                                   "1-12:30:15", "04:00:00", "4h", None])
def test_slurm_time_forms_in_range_pass(value):
    assert time_range_problem("time", value) is None  # "4h": the form check's to say


@pytest.mark.parametrize("value", ["99:99:99", "10:60", "1-24", "1-12:60", "1-12:00:60",
                                   "01:60:00"])
def test_out_of_range_time_fields_are_refused(value):
    assert time_range_problem("time", value) == (
        f"time={value!r} is out of range for a Slurm time limit: minutes and seconds must be "
        "below 60 (and hours below 24 after D-); write minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM "
        "or D-HH:MM:SS, e.g. 04:00:00 or 1-12:00:00")


def test_a_partition_or_account_with_whitespace_is_refused():
    assert slurm_name_problem("partition", "batch,debug") is None
    assert slurm_name_problem("partition", None) is None
    assert slurm_name_problem("account", "my acct") == (
        "account='my acct' holds whitespace, which no Slurm account name has; write the name "
        "as sinfo or sacctmgr shows it")


def test_the_cluster_files_site_values_are_named_by_the_file():
    args = parse([*TINY, "cluster=c.yaml", "partition=a b"])
    cluster = SimpleNamespace(partition="batch", account="x y", time="1-25")
    assert site_value_problems(args, cluster) == [
        "partition='a b' holds whitespace, which no Slurm partition name has; write the name "
        "as sinfo or sacctmgr shows it",
        "c.yaml: account='x y' holds whitespace, which no Slurm account name has; write the "
        "name as sinfo or sacctmgr shows it",
        time_range_problem("c.yaml: time", "1-25")]


def test_launch_refuses_a_bad_time_and_partition_before_rendering(tmp_path):
    one_line_refusal([*TINY, f"cluster={CPU_SLURM}", "time=99:99:99", "--dry-run",
                      f"job_dir={tmp_path}"], "time='99:99:99' is out of range")
    one_line_refusal([*TINY, f"cluster={CPU_SLURM}", "partition=a b", "--dry-run",
                      f"job_dir={tmp_path}"], "partition='a b' holds whitespace")


def test_the_time_help_names_every_accepted_form():
    assert "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS" in LAUNCH.options["time"].help


# -- 6. a cluster folder, counts, what a dry run leaves -----------------------------------------

def test_a_cluster_folder_is_said_to_be_one():
    assert cluster_dir_problem(CPU_SLURM) is None and cluster_dir_problem(None) is None
    assert cluster_dir_problem("conf/cluster") == (
        "cluster=conf/cluster is a directory; name a cluster file in it, e.g. "
        f"cluster={sorted(Path('conf/cluster').glob('*.yaml'))[0]}")


def test_launch_with_a_cluster_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    one_line_refusal([*TINY, "cluster=conf/cluster", "--dry-run", f"job_dir={tmp_path}"],
                     "cluster=conf/cluster is a directory; name a cluster file in it")


def test_counts_of_one_are_singular():
    cfg = SimpleNamespace(name="r", cluster=SimpleNamespace(nodes=2, gpus_per_node=1))
    [line] = placement_problems(cfg, SimpleNamespace(nodes=1), LaunchArgs(cluster="c.yaml"))
    assert line.startswith("r needs 2 nodes of 1 GPU (2 ranks) but cluster=c.yaml has 1;")


def test_a_dry_run_leaves_no_folder_behind(capsys, tmp_path, monkeypatch):
    pytest.importorskip("nemo_run")
    home = tmp_path / "home" / ".nemo_run"
    monkeypatch.setattr("nemo_run.config._NEMORUN_HOME", str(home))  # read at import
    assert job_dir(parse([*TINY, f"cluster={CPU_SLURM}"])) == str(home)
    for given in ([f"job_dir={tmp_path / 'jobs'}"], []):  # given, and NeMo-Run's home
        assert run_launch(parse([*TINY, f"cluster={CPU_SLURM}", "--dry-run", *given])) == 0
        assert "sbatch --requeue" in capsys.readouterr().out
        assert _files(tmp_path) == []

"""scripts/launch.py: the NeMo-Run experiment it builds, read from its rendered sbatch script.

For every registered 64-GPU recipe on the 8 x 8 H100 cluster file: the script asks for nodes =
world / GPUs per node with one task per node, starts one torchrun per node with a c10d
rendezvous on the allocation's first node (found at run time, no host written in) on a port of
this launch's own, passes the recipe and its placement to pretrain.py, and is submitted with
requeue; every requeue continues the same run (a run directory pinned at launch and
`checkpoint.resume=true`), and our torchrun agent (scripts/agent) comes first on PATH.
Refusals are one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import apply_overrides
from recipes.registry import canonical_name, get_recipe, recipe_names
from tests.hang import HANG_S
from trainer.entry.commands import LAUNCH
from trainer.entry.contract import parse_arguments
from trainer.launch.cluster import (
    AGENT_DIR,
    default_rdzv_port,
    launch_args,
    local_path,
    new_run_dir,
    plan_launch,
    run_launch,
)

REPO = Path(__file__).resolve().parents[2]
H100 = str(REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml")
# Phased recipes name their phases' prepared blends, which synthetic data cannot stand in for;
# their sbatch is the one of the same layout without phases.
RECIPES_64 = sorted({canonical_name(name) for name in recipe_names()
                     if get_recipe(name).cluster.world_size == 64 and not get_recipe(name).phases})


BIN = Path(sys.executable).parent


def parse_launch_args(argv: list[str]):
    """scripts/launch.py's command line as the entry contract parses it."""
    args = parse_arguments(LAUNCH, argv)
    return launch_args(args.options, args.flags, args.rest)
RUN_DIR = re.compile(r" run_dir=(\S+) ")
# Runs beyond one node refuse the built-in corpus before launch; the tests' corpus passes.
SYNTHETIC = "data.source=synthetic"


def launch_output(capsys, tmp_path: Path, *argv: str) -> str:
    """Everything a dry run prints: the run directory and rendezvous lines, then the script."""
    pytest.importorskip("nemo_run")
    assert run_launch(parse_launch_args([*argv, "--dry-run", f"job_dir={tmp_path}"])) == 0
    return capsys.readouterr().out


def render(capsys, tmp_path: Path, *argv: str) -> str:
    out = launch_output(capsys, tmp_path, *argv)
    return out[out.index("sbatch --requeue"):] if "sbatch --requeue" in out else out


def pretrain_args(script: str) -> str:
    [srun] = [line for line in script.splitlines() if "torchrun " in line]
    return srun[srun.index("scripts/pretrain.py "):]


def test_there_are_64_gpu_recipes_to_check():
    assert len(RECIPES_64) >= 6


@pytest.mark.parametrize("recipe", RECIPES_64)
def test_sbatch_asks_one_torchrun_per_node_with_a_c10d_rendezvous(recipe, capsys, tmp_path):
    script = render(capsys, tmp_path, f"recipe={recipe}", SYNTHETIC, f"cluster={H100}",
                    "account=acct")
    assert script.splitlines()[0] == "sbatch --requeue --parsable <<'SBATCH'"
    assert "#SBATCH --nodes=8\n" in script  # 64 ranks / 8 GPUs per node
    assert "#SBATCH --ntasks-per-node=1\n" in script and "#SBATCH --gpus-per-node=8\n" in script
    launches = [line for line in script.splitlines() if "torchrun " in line]
    assert len(launches) == 1 and launches[0].startswith("srun ")  # one srun: a task per node
    torchrun = launches[0][launches[0].index("torchrun "):]
    port = re.search(r"--rdzv-backend c10d --rdzv-endpoint \$head_node_ip:(\d+) ", torchrun)
    assert port and 20000 <= int(port.group(1)) <= 29999  # derived, not NeMo-Run's 29500
    assert "--nnodes 8 --nproc-per-node 8 --node-rank $SLURM_NODEID" in torchrun
    # The run directory is fixed now, on the job's shared storage; every requeue resumes it.
    run_dir = f"{tmp_path}/runs/{canonical_name(recipe)}-"
    assert re.fullmatch(
        f"scripts/pretrain.py recipe={recipe} {SYNTHETIC} cluster.nodes=8 cluster.gpus_per_node=8 "
        f"cluster.spec=conf/cluster/h100_80gb_8x8.yaml run_dir={re.escape(run_dir)}"
        r"\d{8}-\d{6} checkpoint.resume=true", pretrain_args(script))
    # The rendezvous host is the allocation's first node, looked up when the job runs.
    assert "nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )" in script
    # Our torchrun agent first, then this environment's torchrun and python.
    [path_line] = [line for line in script.splitlines() if line.startswith("export PATH=")]
    assert path_line == f'export PATH="{REPO / "scripts" / "agent"}:{BIN}:$PATH"'
    assert not re.search(r"\b\d{1,3}(\.\d{1,3}){3}\b", script)  # no IP address written in
    assert "localhost" not in script and "--nodelist" not in script and " -w " not in \
        script.replace('-w "$head_node"', "")
    # What GPU ranks need, never over the job's own values (trainer/launch/environment.py).
    layout = get_recipe(recipe).layout
    assert 'export TORCH_NCCL_AVOID_RECORD_STREAMS="${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}"\n' \
        in script and 'export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"\n' in script
    connections = 'export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"\n'
    assert (connections in script) == (layout.tensor > 1 or layout.context > 1)


def test_retries_requeue_a_failed_job(capsys, tmp_path):
    script = render(capsys, tmp_path, "recipe=8b_tp8_pp4_dp2", SYNTHETIC, f"cluster={H100}",
                    "retries=2",
                    "partition=batch", "time=01:00:00")
    assert "export TORCHX_MAX_RETRIES=2\n" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert "#SBATCH --partition=batch\n" in script and "#SBATCH --time=01:00:00\n" in script


def test_overrides_reach_pretrain_and_a_small_recipe_uses_part_of_a_node(capsys, tmp_path):
    script = render(capsys, tmp_path, "recipe=tiny_dp2", f"cluster={H100}",
                    "train.train_iters=70")
    assert "#SBATCH --nodes=1\n" in script
    assert "--nnodes 1 --nproc-per-node 2" in script
    assert "recipe=tiny_dp2 train.train_iters=70 cluster.nodes=1 cluster.gpus_per_node=2" in script
    assert "--rdzv-endpoint localhost:0" in script  # one node: torchrun picks a free port


def test_launch_prints_the_pinned_run_directory_and_the_port(capsys, tmp_path):
    out = launch_output(capsys, tmp_path, "recipe=8b_tp8_pp4_dp2", SYNTHETIC, f"cluster={H100}",
                        "rdzv_port=31234")
    run_dir = RUN_DIR.search(out).group(1)
    assert f"run directory: {run_dir} (a requeued job continues from its newest checkpoint)\n" \
        in out
    assert "rendezvous: c10d on port 31234 of the job's first node (rdzv_port)\n" in out
    assert "--rdzv-endpoint $head_node_ip:31234 " in out
    assert not Path(run_dir).exists()  # a dry run creates nothing


@pytest.mark.parametrize(("given", "expected", "line"), [
    (["run_dir={mine}"], "run_dir={mine} cluster.nodes=8",
     "run directory: {mine} (a requeued job continues from its newest checkpoint)"),
    (["run_dir={mine}", "checkpoint.resume=false"],
     "run_dir={mine} checkpoint.resume=false cluster.nodes=8",
     "run directory: {mine}; a requeued job starts again from step 0"),
    (["checkpoint.load={ckpt}"], "checkpoint.load={ckpt} cluster.nodes=8",
     "; a requeued job starts again from checkpoint.load={ckpt}"),
])
def test_the_users_own_run_dir_resume_and_load_are_kept(given, expected, line, capsys,
                                                        tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "metadata.json").write_text("{}")
    names = {"mine": tmp_path / "mine", "ckpt": ckpt}
    out = launch_output(capsys, tmp_path, "recipe=8b_tp8_pp4_dp2", SYNTHETIC, f"cluster={H100}",
                        *(arg.format(**names) for arg in given))
    args = pretrain_args(out)
    assert expected.format(**names) in args and line.format(**names) in out
    assert args.count("run_dir=") == 1 and args.count("checkpoint.resume=") <= 1
    assert args.endswith("checkpoint.resume=true") == (len(given) == 1 and "run_dir" in given[0])


def test_the_default_port_depends_on_experiment_and_launch_time():
    now = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    later = now.replace(microsecond=678902)
    ports = {default_rdzv_port(name, when) for name in ("mcore-a", "mcore-b")
             for when in (now, later)}
    assert len(ports) == 4 and all(20000 <= port <= 29999 for port in ports)
    assert default_rdzv_port("mcore-a", now) == default_rdzv_port("mcore-a", now)


def test_two_launches_in_one_second_get_two_run_directories(tmp_path):
    base = tmp_path / "runs" / "tiny_dp2-20250102-030405"
    assert new_run_dir(base, create=True) == base and base.is_dir()
    assert new_run_dir(base, create=False) == base.with_name(f"{base.name}-2")
    assert new_run_dir(base, create=True) == base.with_name(f"{base.name}-2")
    assert new_run_dir(base, create=True) == base.with_name(f"{base.name}-3")


def test_the_local_executor_puts_our_agent_first_on_path():
    assert local_path(f"/usr/bin{os.pathsep}{AGENT_DIR}").split(os.pathsep) == \
        [str(AGENT_DIR), str(BIN), "/usr/bin"]
    assert local_path(f"/usr/bin{os.pathsep}{BIN}").split(os.pathsep) == \
        [str(AGENT_DIR), "/usr/bin", str(BIN)]  # this env's bin dir stays where it was


@pytest.mark.parametrize(("argv", "message"), [
    (["recipe=8b_tp8_pp4_dp2", SYNTHETIC], "cluster= is missing; name a cluster file"),
    (["recipe=8b_tp8_pp4_dp2", SYNTHETIC, "cluster=conf/cluster/h200_1x8.yaml"],
     "needs 8 nodes of 8 GPUs (64 ranks) but cluster=conf/cluster/h200_1x8.yaml has 1"),
    (["recipe=8b_tp8_pp4_dp2", SYNTHETIC, f"cluster={H100}", "executor=local"],
     "executor=local runs on this machine only, but llama3_8b_tp8_pp4_dp2 needs 8 nodes"),
    (["recipe=tiny_dp2", f"cluster={H100}", "executor=k8s"],
     "executor expects one of slurm, local, got 'k8s'"),
    (["recipe=tiny_dp2", f"cluster={H100}", "retries=x"], "retries expects an integer, got 'x'"),
    (["recipe=tiny_dp2", f"cluster={H100}", "rdzv_port=80"],
     "rdzv_port=80 must be a port number from 1024 to 65535, e.g. rdzv_port=23456"),
    (["recipe=tiny_dp2", f"cluster={H100}", "rdzv_port=65536"],
     "rdzv_port=65536 must be a port number from 1024 to 65535"),
    (["recipe=tiny_dp2", f"cluster={H100}", "rdzv_port=x"],
     "rdzv_port expects an integer or null, got 'x'"),
    (["recipe=tiny_dp2", "cluster=nope.yaml"], "cluster=nope.yaml does not exist"),
    (["recipe=tiny_dp2", f"cluster={H100}", f"job_dir={REPO}/jobs"],
     f"job_dir={REPO}/jobs is inside this checkout ({REPO}); NeMo-Run mangles job paths in a "
     "git work tree: use a directory outside it, e.g. job_dir=/shared/jobs"),
    (["recipe=llama3_70b_tp4_pp4_cp2_vpp5_dp2", SYNTHETIC, f"cluster={H100}",
      "parallel.pipeline=1", "parallel.virtual_pipeline=null"],
     "the layout needs 142.40 GB on a rank of pipeline stage 0 but a GPU has 80.00 GB"),
])
def test_launch_refusals_are_one_line(argv, message):
    with pytest.raises(ConfigError) as error:
        plan_launch(parse_launch_args(argv))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_launch_script_mistake_is_one_line_exit_2():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "launch.py"), "recipe=8b_tp8_pp4_dp2",
         SYNTHETIC, "cluster=conf/cluster/h200_1x8.yaml", "--dry-run"],
        capture_output=True, text=True, cwd=REPO, timeout=HANG_S)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: llama3_8b_tp8_pp4_dp2 needs 8 nodes")


CPU_SLURM = str(REPO / "conf" / "cluster" / "cpu_slurm_2x2.yaml")


def test_a_cpu_cluster_asks_no_gpus_and_gives_each_torchrun_its_cpus(capsys, tmp_path):
    script = render(capsys, tmp_path, "recipe=tiny_tp2_pp2", SYNTHETIC, f"cluster={CPU_SLURM}")
    assert "--gpus-per-node" not in script and "--gres" not in script
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --cpus-per-task=2\n" in script
    assert "--nnodes 2 --nproc-per-node 2" in script
    assert "cluster.device=cpu" in pretrain_args(script)  # ranks are processes
    exclusive = tmp_path / "exclusive.yaml"
    exclusive.write_text(Path(CPU_SLURM).read_text().replace("cpus_per_task: 2",
                                                             "exclusive: true"))
    script = render(capsys, tmp_path, "recipe=tiny_tp2_pp2", SYNTHETIC, f"cluster={exclusive}")
    assert "#SBATCH --exclusive\n" in script and "--cpus-per-task" not in script


CPU_LOCAL = str(REPO / "conf" / "cluster" / "cpu_local.yaml")
# tiny_tp2_pp2's 4 ranks on the 2-node CPU cluster's nodes of 2: a launch on 2 nodes.
TWO_NODES = ["recipe=tiny_tp2_pp2", f"cluster={CPU_SLURM}"]
DEMO_CORPUS = ("tiny_tp2_pp2 runs on 2 nodes but data.source=python_stdlib is the built-in demo "
               "corpus")


@pytest.mark.parametrize("flags", [[], ["--dry-run"]], ids=["submit", "dry-run"])
def test_the_demo_corpus_on_the_nodes_a_slurm_launch_uses_is_refused_before_submit(flags,
                                                                                   tmp_path):
    """The recipe itself is one node; the cluster file makes it two. Refused by the launching
    process before anything is rendered, claimed or submitted (job_dir stays empty)."""
    assert get_recipe("tiny_tp2_pp2").cluster.nodes == 1
    with pytest.raises(ConfigError) as error:
        run_launch(parse_launch_args([*TWO_NODES, f"job_dir={tmp_path}", *flags]))
    assert str(error.value).startswith(DEMO_CORPUS) and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []
    plan = plan_launch(parse_launch_args([*TWO_NODES, SYNTHETIC]))  # the tests' corpus passes
    assert plan.nodes == 2


def test_the_local_executor_judges_the_demo_corpus_on_its_own_one_node(tmp_path):
    """A recipe written for 2 nodes of 1 that the local cluster file places on one node runs
    on the demo corpus; on 2 nodes the local executor refuses before the corpus rule."""
    one_node = ["recipe=tiny_dp2", "cluster.nodes=2", "cluster.gpus_per_node=1"]
    plan = plan_launch(parse_launch_args([*one_node, f"cluster={CPU_LOCAL}", "executor=local"]))
    assert (plan.nodes, plan.gpus_per_node, plan.cfg.data.source) == (1, 2, "python_stdlib")
    one_rank_per_node = tmp_path / "cpu_slurm_2x1.yaml"
    one_rank_per_node.write_text(Path(CPU_SLURM).read_text().replace("gpus_per_node: 2",
                                                                     "gpus_per_node: 1"))
    with pytest.raises(ConfigError, match="^tiny_dp2 runs on 2 nodes but data.source="):
        plan_launch(parse_launch_args(["recipe=tiny_dp2", f"cluster={one_rank_per_node}"]))
    with pytest.raises(ConfigError, match="^executor=local runs on this machine only, but "
                                          "tiny_tp2_pp2 needs 2 nodes"):
        plan_launch(parse_launch_args([*TWO_NODES, "executor=local"]))


def test_pretrain_refuses_the_demo_corpus_beyond_one_node_before_any_rank(tmp_path):
    """scripts/pretrain.py's launching process: refused by the path rules, before the machine
    check and before a run directory or rank exists."""
    from trainer.entry.commands import PRETRAIN
    from trainer.entry.pipeline import ready_to_launch, resolve

    args = parse_arguments(PRETRAIN, ["recipe=tiny_dp2", "cluster.nodes=2",
                                      "cluster.gpus_per_node=1", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="^tiny_dp2 runs on 2 nodes but data.source="):
        ready_to_launch(resolve(args), args)
    assert list(tmp_path.iterdir()) == []


def test_nemo_runs_experiment_and_the_tunnel_share_one_directory(tmp_path):
    pytest.importorskip("nemo_run")
    from trainer.launch.cluster import build_task

    args = parse_launch_args(["recipe=tiny_dp2", f"cluster={CPU_SLURM}", f"job_dir={tmp_path}"])
    executor, _ = build_task(plan_launch(args), args)
    assert executor.tunnel.job_dir == str(tmp_path / "experiments")  # NeMo-Run's layout


@pytest.mark.parametrize(("old", "new", "message"), [
    ("device: cpu", "device: tpu", "device='tpu' must be gpu or cpu"),
    ("cpus_per_task: 2", "cpus_per_task: 0", "cpus_per_task=0 must be a positive whole number"),
    ("cpus_per_task: 2", "exclusive: maybe", "exclusive='maybe' must be true or false"),
])
def test_cluster_file_slurm_keys_are_checked(tmp_path, old, new, message):
    from recipes.plan.cluster import load_cluster

    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(CPU_SLURM).read_text().replace(old, new))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_cluster(bad)


def _allowance(lines: list[str], restarts: int) -> int:
    script = "\n".join([*lines, 'echo "$TORCHX_MAX_RETRIES"'])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, "SLURM_RESTART_COUNT": str(restarts)})
    return int(result.stdout)


def test_retries_count_failed_attempts_only_not_requeues(capsys, tmp_path):
    from trainer.launch.agent import FAILED_ATTEMPTS_ENV, note_failed_attempt
    from trainer.launch.cluster import retry_lines

    script = render(capsys, tmp_path, "recipe=tiny_dp2", f"cluster={CPU_SLURM}", "retries=1")
    run_dir = Path(RUN_DIR.search(script).group(1))
    lines = retry_lines(1, str(run_dir))
    assert all(line in script for line in lines)
    assert script.index(lines[-1]) > script.index("export TORCHX_MAX_RETRIES=1\n")
    assert _allowance(lines, 0) == 1  # first attempt: one retry left
    assert _allowance(lines, 1) == 2  # requeued by hand: the retry is still there
    env = {FAILED_ATTEMPTS_ENV: str(run_dir / "slurm_failed_attempts"),
           "SLURM_RESTART_COUNT": "1"}
    note_failed_attempt(env)
    note_failed_attempt(env)  # the other node of the same attempt
    assert _allowance(lines, 2) == 2  # after one requeue and one failure: no retry left


def _requeue(lines: list[str], exitcode: int, tmp_path: Path) -> str:
    """What the script's closing `scontrol requeue` does after an attempt that exited
    `exitcode`, with a stand-in `scontrol` on PATH that says it was called."""
    (tmp_path / "scontrol").write_text('#!/bin/sh\necho "scontrol $*"\n')
    (tmp_path / "scontrol").chmod(0o755)
    script = "\n".join([*lines, f"exitcode={exitcode}", 'scontrol requeue "$SLURM_JOB_ID"'])
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          env=env).stdout


def test_an_attempt_whose_steps_got_sigterm_is_not_requeued(tmp_path):
    from trainer.launch.cluster import retry_lines

    lines = retry_lines(1, str(tmp_path / "run"))
    assert _requeue(lines, 1, tmp_path) == "scontrol requeue 7\n"  # a failure: retried
    assert _requeue(lines, 143, tmp_path).startswith(  # scancel --signal=TERM: a stop
        "not requeued: the job's steps got SIGTERM (scancel --signal=TERM)")


PHASED = ["recipe=tiny_dp2", SYNTHETIC, "train.train_iters=6", "scheduler.warmup_iters=1",
          "model.seq_length=32", "phases=[{name: short, end_step: 3, seq_length: 32}, "
          "{name: long, end_step: 6, seq_length: 64, context: 2, relaunch: true}]"]
RESUME_LONG = ("checkpoint.load=null checkpoint.load_model_only=false checkpoint.resume=true "
               "model.seq_length=64 parallel.context=2 data.documents=concatenate "
               "train.micro_batch_size=2")


def test_a_run_in_phases_is_one_experiment_of_dependent_jobs_in_their_layouts(capsys, tmp_path):
    out = launch_output(capsys, tmp_path, *PHASED, f"cluster={CPU_SLURM}", "retries=1")
    first, second = out.split("# job 1/2: pretrain-short\n")[1].split(
        "# job 2/2: pretrain-long; runs after pretrain-short succeeds (sbatch "
        "--dependency=afterok:<its job id>)\n")
    [run_dir] = set(RUN_DIR.findall(out))  # one run directory for both jobs
    assert pretrain_args(first).endswith(
        f"run_dir={run_dir} checkpoint.resume=true model.seq_length=32 parallel.context=1 "
        "data.documents=concatenate train.micro_batch_size=2")
    assert pretrain_args(second).endswith(f"run_dir={run_dir} checkpoint.resume=true "
                                          + RESUME_LONG)
    assert "sbatch --requeue" in first and "sbatch --requeue" in second  # each job requeues
    assert "slurm_failed_attempts-pretrain-short" in first  # each job counts its own failures
    assert "slurm_failed_attempts-pretrain-long" in second


def test_phase_jobs_are_submitted_with_afterok_on_the_job_before(monkeypatch, capsys, tmp_path):
    """NeMo-Run's own submission with a tunnel that records the commands instead of running
    them (no cluster): the second sbatch waits for the first job's id."""
    pytest.importorskip("nemo_run")
    from types import SimpleNamespace

    from nemo_run.core.tunnel import client

    from trainer.launch import slurm_jobs

    commands = []

    def run(self, command, *args, **kwargs):
        commands.append(command)
        job = 1000 + sum(c.startswith("sbatch") for c in commands)
        return SimpleNamespace(stdout=str(job) if command.startswith("sbatch") else "",
                               stderr="", return_code=0, exited=0, ok=True, failed=False)

    monkeypatch.setattr(client.LocalTunnel, "run", run)
    monkeypatch.setattr(slurm_jobs, "job_state", lambda job: ("PENDING", "squeue"))
    argv = [*PHASED, f"cluster={CPU_SLURM}", f"job_dir={tmp_path}"]
    assert run_launch(parse_launch_args(argv)) == 0
    sbatch = [c for c in commands if c.startswith("sbatch")]
    assert [c.split()[:4] for c in sbatch] == [
        ["sbatch", "--requeue", "--parsable", sbatch[0].split()[3]],
        ["sbatch", "--requeue", "--parsable", "--dependency=afterok:1001"]]
    out = capsys.readouterr().out
    assert "submitted Slurm job 1001 (pretrain-short): PENDING" in out
    assert "submitted Slurm job 1002 (pretrain-long): PENDING" in out


def test_the_local_executor_runs_phase_jobs_in_one_pinned_run_directory(capsys, tmp_path):
    out = launch_output(capsys, tmp_path, *PHASED, f"cluster={CPU_SLURM}", "executor=local")
    assert "# job 2/2: pretrain-long; runs after pretrain-short succeeds\n" in out
    assert len(re.findall(r"'run_dir=([^']+)'", out)) == 2  # a command per job ...
    assert len(set(re.findall(r"'run_dir=([^']+)'", out))) == 1  # ... in one run directory
    second = out[out.index("# job 2/2"):]
    assert all(f"'{arg}'" in second for arg in RESUME_LONG.split())


# --- site settings, containers and paths the cluster alone holds ------------------------------

def site_cluster(tmp_path: Path, settings: str) -> Path:
    """The CPU Slurm cluster file with site settings added (YAML lines)."""
    path = tmp_path / "site" / "site.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(Path(CPU_SLURM).read_text() + settings)
    return path


def prepared_blend(folder: Path) -> tuple[Path, Path]:
    """A blend outside this checkout naming a real manifest in a folder of its own, as a
    user's prepared data would be: (blend file, manifest)."""
    from tests.unit.dataset_fixtures import write_dataset

    data = folder / "lustre" / "data" / "web"
    data.mkdir(parents=True)
    write_dataset(data / "web_0", [[1, 2, 0]] * 40)
    manifest = data / "web.json"
    manifest.write_text('{"eod_id": 0, "vocab_size": 256, "shards": [{"prefix": "web_0"}]}')
    blend = folder / "blends" / "web.yaml"
    blend.parent.mkdir()
    blend.write_text(f"train:\n  - {{manifest: {manifest}, weight: 1.0}}\n")
    return blend, manifest


def srun_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("srun ")]


def test_the_cluster_file_holds_the_site_settings_and_the_command_line_wins(capsys, tmp_path):
    cluster = site_cluster(tmp_path, "account: acct\npartition: batch\ntime: '01:30:00'\n")
    script = render(capsys, tmp_path, "recipe=tiny_tp2_pp2", SYNTHETIC, f"cluster={cluster}")
    assert "#SBATCH --account=acct\n" in script and "#SBATCH --partition=batch\n" in script
    assert "#SBATCH --time=01:30:00\n" in script
    script = render(capsys, tmp_path, "recipe=tiny_tp2_pp2", SYNTHETIC, f"cluster={cluster}",
                    "partition=debug", "time=00:20:00")
    assert "#SBATCH --partition=debug\n" in script and "#SBATCH --time=00:20:00\n" in script
    assert "#SBATCH --account=acct\n" in script  # what the command line leaves: the file's


def test_a_job_checks_every_path_on_the_cluster_in_its_first_step(capsys, tmp_path):
    script = render(capsys, tmp_path, "recipe=tiny_tp2_pp2", SYNTHETIC, f"cluster={CPU_SLURM}")
    first, training = srun_lines(script)
    assert first == (f"srun --nodes=1 --ntasks=1 --chdir {REPO} python scripts/pretrain.py "
                     f"{pretrain_args(script).removeprefix('scripts/pretrain.py ')} check=paths "
                     "|| exit 2")
    assert script.index(first) < script.index(training) and "torchrun " in training


def test_a_container_job_mounts_what_the_run_needs_and_runs_the_images_python(capsys, tmp_path):
    """Mounts: the cluster file's and the command line's first, then, each at its own path, the
    checkout, the job directory (its runs/ too), the blend's folder, the data's and the cluster
    file's, with nothing the user's mounts cover twice. No host virtualenv on PATH: the image's
    python3 runs our torchrun agent (a line of its own per node), which starts the ranks."""
    blend, manifest = prepared_blend(tmp_path)
    cluster = site_cluster(tmp_path, "container_image: nvcr.io/nvidia/pytorch:25.01-py3\n"
                                     "container_mounts: [/scratch:/scratch]\n")
    job_dir = tmp_path / "jobs"
    out = launch_output(capsys, job_dir, "recipe=tiny_tp2_pp2", "data.source=blend",
                        f"data.blend={blend}", f"cluster={cluster}",
                        f"container_mounts={blend.parent}:/blends:ro")
    script = out[out.index("sbatch --requeue"):]
    check, training = srun_lines(script)
    mounts = re.search(r"--container-mounts (\S+) ", training).group(1).split(",")
    own = [f"{path}:{path}" for path in (REPO, job_dir, manifest.parent, blend.parent,
                                          cluster.parent)]
    assert mounts[:2] == ["/scratch:/scratch", f"{blend.parent}:/blends:ro"]  # the user's
    assert sorted(mounts[2:7]) == sorted(own)  # then the run's, each once
    assert mounts[7] == f"{job_dir}/experiments:{job_dir}/experiments"  # NeMo-Run's own
    assert len(mounts) == 9 and mounts[8].endswith("/pretrain:/nemo_run")
    assert "--container-image nvcr.io/nvidia/pytorch:25.01-py3 " in training
    assert "export PATH=" not in script and str(BIN) not in script  # not the host's venv
    agent = training[training.index("--kill-on-bad-exit=1 ") + len("--kill-on-bad-exit=1 "):]
    port = re.search(r"--rdzv-endpoint \$head_node_ip:(\d+) ", agent).group(1)
    assert agent == (f"python3 scripts/agent/torchrun --rdzv-backend c10d --rdzv-endpoint "
                     f"$head_node_ip:{port} --rdzv-id {port} --nnodes 2 --nproc-per-node 2 "
                     f"--node-rank $SLURM_NODEID --tee 3 {pretrain_args(agent)}")
    assert "#SBATCH --ntasks-per-node=1\n" in script  # one agent per node
    # the variables the job sets reach the container over the image's own
    assert "--container-env MCORE_RECIPES_FAILED_ATTEMPTS,CUDA_DEVICE_MAX_CONNECTIONS," in training
    # the paths are checked in the same image with the same mounts, before the ranks start
    assert check.startswith("srun --nodes=1 --ntasks=1 --container-image nvcr.io/nvidia/"
                            f"pytorch:25.01-py3 --container-mounts {','.join(mounts[:7])} "
                            f"--container-workdir {REPO} ")
    assert check.endswith(" python3 scripts/pretrain.py " + pretrain_args(agent).removeprefix(
        "scripts/pretrain.py ") + " check=paths || exit 2")


def test_a_container_job_runs_the_python_it_is_told_to(capsys, tmp_path):
    venv = "/shared/venv"  # a virtualenv on shared storage, not under the job directory
    script = render(capsys, tmp_path, "recipe=tiny_dp2", SYNTHETIC, f"cluster={CPU_SLURM}",
                    "container_image=img:1", f"container_python={venv}/bin/python")
    check, training = srun_lines(script)
    assert f"{venv}:{venv}" in training and f" {venv}/bin/python scripts/agent/torchrun " in \
        training and f" {venv}/bin/python scripts/pretrain.py " in check
    assert "--rdzv-endpoint localhost:0 " in training and "--node-rank 0 " in training


def test_a_container_job_mounts_a_relative_run_dir_and_a_saved_config_where_the_job_finds_them(
        capsys, tmp_path):
    """A relative run_dir is where the job puts it, in this checkout (mounted; never a
    `relative:relative` mount pyxis refuses); a `config=FILE` elsewhere has its folder mounted;
    the overrides the launch places replace the user's own, once each on the job's line."""
    from recipes.config.io import save_config

    saved = save_config(get_recipe("tiny_dp2"), tmp_path / "saved" / "base.yaml")
    script = render(capsys, tmp_path / "jobs", f"config={saved}", SYNTHETIC,
                    f"cluster={CPU_SLURM}",
                    "container_image=img:1", "run_dir=relative/run", "cluster.nodes=1",
                    "cluster.gpus_per_node=2")
    _, training = srun_lines(script)
    mounts = re.search(r"--container-mounts (\S+) ", training).group(1).split(",")
    assert not [m for m in mounts if not m.startswith("/")]
    assert f"{saved.parent}:{saved.parent}" in mounts
    assert training.count("cluster.nodes=") == 1 and training.count("cluster.gpus_per_node=") == 1


def test_a_relative_container_python_is_refused():
    with pytest.raises(ConfigError, match="container_python=env/bin/python is a relative path"):
        plan_launch(parse_launch_args(["recipe=tiny_dp2", SYNTHETIC, f"cluster={CPU_SLURM}",
                                       "container_image=img:1",
                                       "container_python=env/bin/python"]))


@pytest.mark.parametrize(("settings", "message"), [
    ("time: 4h\n", "time='4h' is not a Slurm time limit"),
    ("account: ''\n", "account='' must be text"),
    ("container_mounts: /a:/a\n", "container_mounts must be a list"),
    ("container_mounts: [data:/data]\n", "container mount 'data:/data' must be SOURCE"),
    ("partiton: batch\n", "unknown key 'partiton'; did you mean partition?"),
])
def test_cluster_file_site_settings_are_checked(tmp_path, settings, message):
    from recipes.plan.cluster import load_cluster

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_cluster(site_cluster(tmp_path, settings))


def test_a_dry_run_renders_paths_only_the_cluster_has_and_a_submit_checks_them(capsys,
                                                                              tmp_path):
    """A blend, its data and a checkpoint on a file system this machine does not have: the
    dry run renders and names them in one line (the job's first step checks them); a submit
    from here refuses them, each in one line."""
    blend, _ = prepared_blend(tmp_path)
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("train:\n  - {manifest: /lustre-not-here/web/web.json}\n")
    argv = ["recipe=tiny_tp2_pp2", "data.source=blend", f"data.blend={elsewhere}",
            "checkpoint.load=/lustre-not-here/run/checkpoints", f"cluster={CPU_SLURM}"]
    out = launch_output(capsys, tmp_path, *argv)
    assert ("paths not on this machine, checked on the cluster by the job's first step "
            "(scripts/pretrain.py check=paths) before any rank starts: data.blend: "
            "/lustre-not-here/web/web.json, checkpoint.load: /lustre-not-here/run/checkpoints"
            "\n") in out
    assert "check=paths || exit 2" in out
    with pytest.raises(ConfigError) as refused:
        plan_launch(parse_launch_args([*argv, f"job_dir={tmp_path}"]))
    assert [line.split(" ")[0] for line in refused.value.messages] == [
        "checkpoint.load=/lustre-not-here/run/checkpoints", f"data.blend={elsewhere}:"]


def test_a_mount_the_user_gives_at_its_own_path_covers_what_lies_under_it(tmp_path):
    """What the run needs is mounted only where no identity mount of the user's (or another
    of the run's) holds it already; a mount to another place covers nothing."""
    from trainer.launch.job_paths import container_mounts

    blend, manifest = prepared_blend(tmp_path)
    cfg = apply_overrides(get_recipe("tiny_dp2"), ["data.source=blend", f"data.blend={blend}"])
    jobs = tmp_path / "jobs"
    mounts = container_mounts(cfg, str(jobs), str(jobs / "runs" / "r"),
                              given=[f"{tmp_path}/lustre", f"{tmp_path}:/elsewhere"])
    assert mounts == [f"{tmp_path}/lustre", f"{tmp_path}:/elsewhere", f"{REPO}:{REPO}",
                      f"{blend.parent}:{blend.parent}", f"{jobs}:{jobs}"]


@pytest.mark.parametrize("given", ["container_python=/opt/venv/bin/python",
                                   "container_mounts=/scratch:/scratch"])
def test_container_settings_without_an_image_are_refused(given, capsys, tmp_path):
    """Without container_image (here or in the cluster file) the job runs on the nodes' own
    system, and a container's Python or mounts would be dropped silently."""
    pytest.importorskip("nemo_run")
    key = given.partition("=")[0]
    with pytest.raises(ConfigError) as error:
        run_launch(parse_launch_args(["recipe=tiny_dp2", SYNTHETIC, f"cluster={H100}", given,
                                      "--dry-run", f"job_dir={tmp_path}"]))
    assert str(error.value) == (f"{key}= sets up the job's container, but no container_image "
                                "is given (here or in the cluster file): give "
                                f"container_image=..., or drop {key}=")

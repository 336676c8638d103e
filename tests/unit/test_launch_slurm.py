"""scripts/launch.py: the NeMo-Run experiment it builds, read from its rendered sbatch script.

For every registered 64-GPU recipe on the 8 x 8 H100 cluster file: the script asks for nodes =
world / GPUs per node with one task per node, starts one torchrun per node with a c10d
rendezvous on the allocation's first node (found at run time, no host written in), passes the
recipe and its placement to pretrain.py, and is submitted with requeue. Refusals are one line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.config.errors import ConfigError
from recipes.registry import canonical_name, get_recipe, recipe_names
from trainer.cluster_launch import parse_launch_args, plan_launch, run_launch

REPO = Path(__file__).resolve().parents[2]
H100 = str(REPO / "conf" / "cluster" / "h100_80gb_8x8.yaml")
RECIPES_64 = sorted({canonical_name(name) for name in recipe_names()
                     if get_recipe(name).cluster.world_size == 64})


def render(capsys, tmp_path: Path, *argv: str) -> str:
    pytest.importorskip("nemo_run")
    assert run_launch([*argv, "--dry-run", f"job_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    return out[out.index("sbatch --requeue"):] if "sbatch --requeue" in out else out


def test_there_are_64_gpu_recipes_to_check():
    assert len(RECIPES_64) >= 6


@pytest.mark.parametrize("recipe", RECIPES_64)
def test_sbatch_asks_one_torchrun_per_node_with_a_c10d_rendezvous(recipe, capsys, tmp_path):
    script = render(capsys, tmp_path, f"recipe={recipe}", f"cluster={H100}", "account=acct")
    assert script.splitlines()[0] == "sbatch --requeue --parsable <<'SBATCH'"
    assert "#SBATCH --nodes=8\n" in script  # 64 ranks / 8 GPUs per node
    assert "#SBATCH --ntasks-per-node=1\n" in script and "#SBATCH --gpus-per-node=8\n" in script
    launches = [line for line in script.splitlines() if "torchrun " in line]
    assert len(launches) == 1 and launches[0].startswith("srun ")  # one srun: a task per node
    torchrun = launches[0][launches[0].index("torchrun "):]
    assert re.search(r"--rdzv-backend c10d --rdzv-endpoint \$head_node_ip:\d+ ", torchrun)
    assert "--nnodes 8 --nproc-per-node 8 --node-rank $SLURM_NODEID" in torchrun
    assert torchrun.endswith(f"scripts/pretrain.py recipe={recipe} cluster.nodes=8 "
                             "cluster.gpus_per_node=8 cluster.spec=conf/cluster/h100_80gb_8x8.yaml")
    # The rendezvous host is the allocation's first node, looked up when the job runs.
    assert "nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )" in script
    assert f'export PATH="{Path(sys.executable).parent}:$PATH"' in script  # this env's torchrun
    assert not re.search(r"\b\d{1,3}(\.\d{1,3}){3}\b", script)  # no IP address written in
    assert "localhost" not in script and "--nodelist" not in script and " -w " not in \
        script.replace('-w "$head_node"', "")


def test_retries_requeue_a_failed_job(capsys, tmp_path):
    script = render(capsys, tmp_path, "recipe=8b_tp8_pp4_dp2", f"cluster={H100}", "retries=2",
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


@pytest.mark.parametrize(("argv", "message"), [
    (["recipe=8b_tp8_pp4_dp2"], "cluster= is missing; name a cluster file"),
    (["recipe=8b_tp8_pp4_dp2", "cluster=conf/cluster/h200_1x8.yaml"],
     "needs 8 nodes of 8 GPUs (64 ranks) but cluster=conf/cluster/h200_1x8.yaml has 1"),
    (["recipe=8b_tp8_pp4_dp2", f"cluster={H100}", "executor=local"],
     "executor=local runs on this machine only, but llama3_8b_tp8_pp4_dp2 needs 8 nodes"),
    (["recipe=tiny_dp2", f"cluster={H100}", "executor=k8s"], "executor=k8s is not known"),
    (["recipe=tiny_dp2", f"cluster={H100}", "retries=x"], "retries=x must be a whole number"),
    (["recipe=tiny_dp2", "cluster=nope.yaml"], "cluster=nope.yaml does not exist"),
])
def test_launch_refusals_are_one_line(argv, message):
    with pytest.raises(ConfigError) as error:
        plan_launch(parse_launch_args(argv))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_launch_script_mistake_is_one_line_exit_2():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "launch.py"), "recipe=8b_tp8_pp4_dp2",
         "cluster=conf/cluster/h200_1x8.yaml", "--dry-run"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: llama3_8b_tp8_pp4_dp2 needs 8 nodes")

"""Wrong machine: one line saying what the recipe needs, what was found, and how to dry-run."""

from __future__ import annotations

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.machine import (
    CPU_RANK_CAP,
    MachineInfo,
    check_machine,
    count_gpus,
    detect_machine,
    half_launched_problem,
    launched_world_size,
    process_on_cpu,
    ranks_on_cpu,
)
from recipes.config.overrides import apply_overrides
from recipes.registry import get_recipe

NO_GPU = MachineInfo(gpus=0, launched_world_size=None)


def test_64_gpu_recipe_on_a_laptop_is_one_line_with_the_dry_run_command() -> None:
    with pytest.raises(ConfigError) as caught:
        check_machine(get_recipe("8b_tp8_pp4_dp2"), NO_GPU)
    assert str(caught.value) == (
        "recipe llama3_8b_tp8_pp4_dp2 needs 64 GPUs: 8 nodes x 8, TP8 x PP4 x DP2; found 0 GPUs "
        "and no multi-node launch (WORLD_SIZE unset); inspect it here with: "
        "python scripts/pretrain.py recipe=llama3_8b_tp8_pp4_dp2 dry_run=true"
    )


def test_dry_run_hint_repeats_the_users_arguments() -> None:
    with pytest.raises(ConfigError) as caught:
        check_machine(
            get_recipe("8b_tp8_dp8"),
            NO_GPU,
            ["recipe=8b_tp8_dp8", "optimizer.lr=2e-4", "dry_run=false"],
        )
    assert str(caught.value).endswith(
        "python scripts/pretrain.py recipe=8b_tp8_dp8 optimizer.lr=2e-4 dry_run=true"
    )


def test_dry_run_skips_the_check() -> None:
    cfg = apply_overrides(get_recipe("llama3_8b_tp8_pp4_dp2"), ["dry_run=true"])
    check_machine(cfg, NO_GPU)


def test_multi_node_launch_with_matching_world_and_gpus_is_accepted() -> None:
    check_machine(get_recipe("8b_tp8_pp4_dp2"), MachineInfo(gpus=8, launched_world_size=64,
                                                            transformer_engine="2.8.0"))


def test_multi_node_launch_with_the_wrong_world_size() -> None:
    with pytest.raises(ConfigError, match="this process was launched with WORLD_SIZE=16; inspect"):
        check_machine(get_recipe("8b_tp8_pp4_dp2"), MachineInfo(gpus=8, launched_world_size=16))


def test_multi_node_launch_without_enough_gpus_per_node() -> None:
    with pytest.raises(ConfigError, match="found 4 GPUs on this node, 8 needed"):
        check_machine(get_recipe("8b_tp8_pp4_dp2"), MachineInfo(gpus=4, launched_world_size=64))


def test_multi_node_launch_on_cpu_nodes_is_refused_unless_the_cluster_is_cpu() -> None:
    cfg = get_recipe("8b_tp8_pp4_dp2")
    cpu_nodes = MachineInfo(gpus=0, launched_world_size=64)
    with pytest.raises(ConfigError, match="found 0 GPUs on this node of a multi-node launch"):
        check_machine(cfg, cpu_nodes)
    check_machine(apply_overrides(cfg, ["cluster.device=cpu"]), cpu_nodes)


@pytest.mark.parametrize("launched", [None, 4])
def test_single_node_tiny_recipe_runs_on_cpu(launched) -> None:
    check_machine(get_recipe("tiny_tp2_pp2"), MachineInfo(gpus=0, launched_world_size=launched))


def test_cpu_runtime_rank_cap() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp1"), [f"cluster.gpus_per_node={CPU_RANK_CAP + 1}"])
    with pytest.raises(ConfigError, match=f"the CPU runtime runs at most {CPU_RANK_CAP} local"):
        check_machine(cfg, NO_GPU)
    check_machine(apply_overrides(cfg, [f"cluster.gpus_per_node={CPU_RANK_CAP}"]), NO_GPU)


def test_single_node_with_too_few_gpus() -> None:
    with pytest.raises(ConfigError, match=r"needs 4 GPUs: 1 node x 4, TP2 x PP2 x DP1; found 2"):
        check_machine(get_recipe("tiny_tp2_pp2"), MachineInfo(gpus=2, launched_world_size=None))


def test_gpu_device_without_gpus() -> None:
    cfg = apply_overrides(get_recipe("tiny_dp2"), ["cluster.device=gpu"])
    with pytest.raises(ConfigError, match="found 0 GPUs and cluster.device=gpu"):
        check_machine(cfg, NO_GPU)


def test_where_ranks_compute_follows_cluster_device() -> None:
    auto = get_recipe("tiny_dp1").cluster
    assert ranks_on_cpu(auto, gpus=0)
    assert not ranks_on_cpu(auto, gpus=4)
    assert not ranks_on_cpu(get_recipe("8b_tp8_pp4_dp2").cluster, gpus=0)  # a broken GPU node
    cpu = apply_overrides(get_recipe("8b_tp8_pp4_dp2"), ["cluster.device=cpu"]).cluster
    assert ranks_on_cpu(cpu, gpus=8)
    gpu = apply_overrides(get_recipe("tiny_dp1"), ["cluster.device=gpu"]).cluster
    assert not ranks_on_cpu(gpu, gpus=0)
    # In one process: auto follows CUDA, also for a 64-GPU recipe's dry run on a laptop.
    assert process_on_cpu(get_recipe("8b_tp8_pp4_dp2").cluster, cuda=False)
    assert not process_on_cpu(auto, cuda=True) and process_on_cpu(cpu, cuda=True)
    assert not process_on_cpu(gpu, cuda=False)


def test_describe_layout_mentions_only_used_dimensions() -> None:
    assert get_recipe("8b_tp8_dp8").layout.describe() == "TP8 x PP1 x DP8"
    assert (
        get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2").layout.describe()
        == "TP4 x PP4 (VPP5) x CP2 x DP2"
    )
    assert get_recipe("mixtral_8x7b_tp1_pp4_ep8_dp16").layout.describe() == "TP1 x PP4 x DP16, EP8"


def _fake_devices(root, names):
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).touch()
    return root


def test_count_gpus_from_device_files(tmp_path) -> None:
    dev = _fake_devices(
        tmp_path / "dev", ["nvidia0", "nvidia1", "nvidia7", "nvidiactl", "nvidia-uvm", "null"]
    )
    no_proc = tmp_path / "no_proc"
    assert count_gpus(dev, no_proc) == 3
    assert count_gpus(dev, no_proc, visible_devices="0,1") == 2
    assert count_gpus(dev, no_proc, visible_devices="") == 0
    assert count_gpus(dev, no_proc, visible_devices="1,-1,0") == 1
    assert count_gpus(tmp_path / "none", no_proc) == 0


def test_count_gpus_from_driver_proc_listing(tmp_path) -> None:
    proc = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:41:00.0"):
        (proc / bus).mkdir(parents=True)
    assert count_gpus(tmp_path / "empty_dev", proc) == 2


def test_launched_world_size_from_environment() -> None:
    assert launched_world_size({}) is None
    assert launched_world_size({"WORLD_SIZE": "64"}) == 64
    with pytest.raises(ConfigError, match="WORLD_SIZE='x' is not an integer"):
        launched_world_size({"WORLD_SIZE": "x"})


def test_detect_machine_reads_the_environment() -> None:
    machine = detect_machine({"WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": ""})
    assert machine == MachineInfo(gpus=0, launched_world_size=8)


def test_plain_srun_tasks_are_refused_with_the_torchrun_command() -> None:
    with pytest.raises(ConfigError) as caught:
        detect_machine({"SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "3"})
    message = str(caught.value)
    assert message.startswith("started by srun as 16 tasks without torchrun")
    assert "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES" in message
    # One srun task (an interactive allocation) self-launches; torchrun under srun is a launch.
    assert detect_machine({"SLURM_STEP_NUM_TASKS": "1"}).launched_world_size is None
    launched = {"SLURM_STEP_NUM_TASKS": "2", "WORLD_SIZE": "16", "CUDA_VISIBLE_DEVICES": ""}
    assert detect_machine(launched).launched_world_size == 16


TORCHRUN_ENV = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "node1",
                "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("drop", "change", "said"), [
    (("RANK",), {}, "RANK is not set"),
    (("RANK", "MASTER_ADDR", "MASTER_PORT"), {}, "RANK, MASTER_ADDR, MASTER_PORT are not set"),
    ((), {"MASTER_ADDR": " "}, "MASTER_ADDR is not set"),
    ((), {"MASTER_PORT": "port"}, "MASTER_PORT='port' is not a port number"),
])
def test_a_half_launched_rank_is_one_line_not_torchs_traceback(drop, change, said) -> None:
    """Before: LOCAL_RANK and WORLD_SIZE exported in a shell without RANK ended the script in
    torch's `ValueError: Error initializing torch.distributed using env:// rendezvous`."""
    environ = {k: v for k, v in {**TORCHRUN_ENV, **change}.items() if k not in drop}
    assert half_launched_problem(environ) == (
        f"LOCAL_RANK and WORLD_SIZE are set, so this process runs as one rank of a launched "
        f"run, but {said}; start it with torchrun (which sets them all), or unset LOCAL_RANK "
        "and WORLD_SIZE for the script to launch its own ranks")
    with pytest.raises(ConfigError, match="^LOCAL_RANK and WORLD_SIZE are set"):
        detect_machine({**environ, "CUDA_VISIBLE_DEVICES": ""})


def test_what_torchrun_sets_and_an_unlaunched_process_pass() -> None:
    assert half_launched_problem(TORCHRUN_ENV) is None
    assert half_launched_problem({"WORLD_SIZE": "8"}) is None  # no LOCAL_RANK: not a rank
    assert half_launched_problem({}) is None

"""`plan.py calibrate=true` writes its figures into the cluster file: each key replaced in place
with its comment kept, missing keys appended, every other line kept, and the file still loads;
the collective fit recovers a known latency and bandwidth; `host_cores` goes into CPU files
only. (The speed itself is not tested.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.plan.cluster import load_cluster
from trainer.tools.calibrate import fit_collectives, host_cores_figure, update_cluster_file

REPO = Path(__file__).resolve().parents[2]


def test_figures_replace_keys_in_place_and_append_the_rest(tmp_path):
    path = tmp_path / "cpu.yaml"
    shutil.copy(REPO / "conf/cluster/cpu_local.yaml", path)
    before = path.read_text().splitlines()
    update_cluster_file(str(path), {"intra_node_gb_per_s": 0.6873, "gemm_half_dim": 41.0,
                                    "collective_latency_us": 5559.0})
    after = path.read_text().splitlines()
    replaced = "intra_node_gb_per_s: 0.6873  # gloo over shared memory, per rank, one direction"
    assert [line.startswith("intra_node_gb_per_s") for line in before].index(True) \
        == after.index(replaced)  # the line where the key stood
    assert [line for line in after if not line.startswith(
        ("intra_node", "gemm_half_dim", "collective_latency"))] == [
        line for line in before if not line.startswith("intra_node")]
    cluster = load_cluster(str(path))
    assert (cluster.intra_node_gb_per_s, cluster.gemm_half_dim,
            cluster.collective_latency_us) == (0.6873, 41.0, 5559.0)
    update_cluster_file(str(path), {"gemm_half_dim": 50.0})  # a second run replaces, once
    assert path.read_text().count("gemm_half_dim") == 1 and load_cluster(
        str(path)).gemm_half_dim == 50.0


def test_collective_fit_recovers_latency_and_bandwidth():
    ranks, latency, bandwidth = 4, 5e-4, 2e9
    points = [(size, latency + size * 2 * (ranks - 1) / ranks / bandwidth)
              for size in (4, 4096, 1 << 20, 8 << 20)]
    fitted_latency, fitted_bandwidth = fit_collectives(points, ranks)
    assert fitted_latency == pytest.approx(latency, rel=1e-6)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)


def test_host_cores_is_written_for_cpu_files_only(tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert host_cores_figure("cpu") == {"host_cores": cores}
    assert host_cores_figure("gpu") == {}
    path = tmp_path / "cpu.yaml"
    shutil.copy(REPO / "conf/cluster/cpu_local.yaml", path)
    update_cluster_file(str(path), host_cores_figure(load_cluster(str(path)).device))
    assert load_cluster(str(path)).host_cores == cores  # written as a whole number, loads
    gpu = tmp_path / "h200.yaml"
    shutil.copy(REPO / "conf/cluster/h200_1x8.yaml", gpu)
    before = gpu.read_text()
    update_cluster_file(str(gpu), host_cores_figure(load_cluster(str(gpu)).device))
    assert gpu.read_text() == before and load_cluster(str(gpu)).host_cores is None


def test_kernel_cost_is_a_layers_time_beyond_its_gemms_over_its_kernels():
    from trainer.tools.calibrate import kernel_cost_from_layers

    # 2 ms a step plus 5 ms a layer, 1.4 ms of it GEMMs, over 72 kernels: 50 us each
    times = {1: 0.007, 3: 0.017}
    assert kernel_cost_from_layers(times, 0.0014, 72) == pytest.approx(50e-6)
    assert kernel_cost_from_layers(times, 0.0, 72) == pytest.approx(0.005 / 72)
    assert kernel_cost_from_layers(times, 0.009, 72) == 0.0  # GEMMs priced above it: none


def test_calibrate_writes_the_layers_kernel_cost_for_cpu_files(tmp_path, monkeypatch):
    import trainer.tools.calibrate as calibrate
    from recipes.plan.steptime import layer_forward_seconds, layer_kernels
    from recipes.registry import get_recipe

    monkeypatch.setattr(calibrate, "measure_gemms", lambda *a, **k: [(64, 0.05), (512, 0.08)])
    monkeypatch.setattr(calibrate, "measure_collectives",
                        lambda *a, **k: ("gloo", [(4, 1e-3), (4096, 2e-3)], 12e-6))
    monkeypatch.setattr(calibrate, "time_layers", lambda one: 0.002 + 0.005 * one.model.num_layers)
    cfg = get_recipe("tiny_tp2_pp2")
    path = tmp_path / "cpu.yaml"
    shutil.copy(REPO / "conf/cluster/cpu_local.yaml", path)
    cluster = load_cluster(str(path))
    calibrate.calibrate_cluster_file(cluster, "fp32", str(path), cfg)
    written = load_cluster(str(path))
    fraction, half = written.gemm_peak_fraction, written.gemm_half_dim
    products, core = layer_forward_seconds(calibrate.one_micro_batch(cfg, 1), 0.2e12,
                                           fraction, half)
    expected = (0.005 - 3 * (products + core)) / layer_kernels("none") * 1e6
    assert written.kernel_overhead_us == pytest.approx(expected, rel=1e-3)
    assert written.kernel_overhead_us > 12  # not the bare product's
    gpu = tmp_path / "h200.yaml"
    shutil.copy(REPO / "conf/cluster/h200_1x8.yaml", gpu)
    monkeypatch.setattr(calibrate, "measure_gemms", lambda *a, **k: [(1024, 400.0), (8192, 700.0)])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # as on one of its nodes
    calibrate.calibrate_cluster_file(load_cluster(str(gpu)), "bf16", str(gpu), cfg)
    assert load_cluster(str(gpu)).kernel_overhead_us == pytest.approx(12)  # GPUs: the product


def test_a_gpu_file_is_not_calibrated_on_a_machine_without_gpus(tmp_path, monkeypatch):
    import trainer.tools.calibrate as calibrate

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(calibrate, "measure_gemms", lambda *a, **k: pytest.fail("measured"))
    gpu = tmp_path / "h100.yaml"
    shutil.copy(REPO / "conf/cluster/h100_80gb_8x8.yaml", gpu)
    before = gpu.read_text()
    with pytest.raises(ConfigError, match="describes GPU nodes and this machine has no GPU"):
        calibrate.calibrate_cluster_file(load_cluster(str(gpu)), "bf16", str(gpu))
    assert gpu.read_text() == before


def test_a_figure_the_loader_refuses_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "cpu.yaml"
    shutil.copy(REPO / "conf/cluster/cpu_local.yaml", path)
    before = path.read_text()
    with pytest.raises(ConfigError, match=r"left as it was \(gemm_peak_fraction=0 must be"):
        update_cluster_file(str(path), {"gemm_peak_fraction": 0.0, "gemm_half_dim": 41.0})
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.yaml"]  # no draft left


def test_a_read_only_cluster_file_is_refused_and_a_writable_one_keeps_its_mode(tmp_path):
    from trainer.tools.calibrate import refuse_read_only_file

    path = tmp_path / "cpu.yaml"
    shutil.copy(REPO / "conf/cluster/cpu_local.yaml", path)
    path.chmod(0o640)
    refuse_read_only_file(str(path))  # writable: nothing said
    update_cluster_file(str(path), {"gemm_half_dim": 41.0})
    assert path.stat().st_mode & 0o777 == 0o640
    path.chmod(0o444)
    with pytest.raises(ConfigError) as error:
        refuse_read_only_file(str(path))
    assert str(error.value) == (f"cluster={path} is read-only; calibrate=true writes its figures "
                                f"into it: make it writable (chmod u+w {path}), or copy it and "
                                "calibrate the copy")

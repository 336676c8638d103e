"""`plan.py calibrate=true` writes its figures into the cluster file: each key replaced in place
with its comment kept, missing keys appended, every other line kept, and the file still loads;
the collective fit recovers a known latency and bandwidth; `host_cores` goes into CPU files
only. (The speed itself is not tested.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

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
    assert "intra_node_gb_per_s: 0.6873  # gloo over shared memory, per rank, one direction" \
        in after
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
